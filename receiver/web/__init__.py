"""The inbox web page on the ops listener (``/ui/``): see every event and delivery, redeliver.

Server-rendered pages (Jinja2 templates with autoescaping, one stylesheet and one small script,
all shipped in this package; nothing is loaded from elsewhere):

- overview: events by state, one row per sink lane, the upstream subscriptions, the upstream's
  API (the revision of its OpenAPI document, the pinned version, what changed that the receiver
  reads, endpoints being retired), recent errors;
- events: newest first, filtered by state, event name, sink, event or job id and time range,
  paged with a cursor (as fast deep in a million events as on the first page);
- one event: the webhook body as received, the job fetched for it, each delivery with its
  attempts, next attempt and last error, and redeliver buttons;
- dead letters: dead deliveries grouped by sink and error, redelivered a group at a time.

:mod:`receiver.web.ui` holds the application and its guard (sign-in, sessions, CSRF),
:mod:`receiver.web.pages` the handlers, :mod:`receiver.web.upstream` the overview's upstream
sections.
"""

from receiver.web.ui import InboxUi

__all__ = ["InboxUi"]
