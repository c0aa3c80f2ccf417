"""The events page's query string: filters, page cursor, and the links that keep them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlencode

from receiver.store.browse import Cursor, EventQuery
from receiver.store.records import EVENT_STATES

DELIVERY_STATES = (*EVENT_STATES, "skipped")
FILTER_FIELDS = ("state", "event", "sink", "q", "since", "until")
MAX_TEXT = 200


class BadFilter(ValueError):
    """A filter value the page cannot use; the message names the field."""


@dataclass(frozen=True)
class EventsRequest:
    """A parsed events-page request: the query, at most one cursor, and the raw filter values
    (to fill the form and build the paging links)."""

    query: EventQuery
    before: Cursor | None
    after: Cursor | None
    values: Mapping[str, str]

    def link(self, **cursor: str) -> str:
        """``?`` + the filters in force, plus ``before=`` or ``after=`` when given."""
        params = {k: v for k, v in self.values.items() if v}
        params.update(cursor)
        return "?" + urlencode(params) if params else "?"


def parse_time(field: str, text: str) -> float:
    """``2026-11-23T09:30`` (as a ``datetime-local`` field sends it, read as UTC), an ISO time
    with an offset, or unix seconds."""
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(value):
            return value
        raise BadFilter(f"{field}: not a time")
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadFilter(f"{field}: use YYYY-MM-DDTHH:MM (UTC) or unix seconds") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def parse_events_request(query: Mapping[str, str]) -> EventsRequest:
    """The filters and cursor of ``query``; BadFilter names the first field that is wrong."""
    values = {name: query.get(name, "").strip() for name in FILTER_FIELDS}
    for name, text in values.items():
        if len(text) > MAX_TEXT:
            raise BadFilter(f"{name}: at most {MAX_TEXT} characters")
    state = values["state"] or None
    sink = values["sink"] or None
    allowed = DELIVERY_STATES if sink else EVENT_STATES
    if state is not None and state not in allowed:
        if state in DELIVERY_STATES:
            raise BadFilter(f"state: {state} is a delivery state; choose a sink too")
        raise BadFilter(f"state: one of {', '.join(allowed)}")
    since = parse_time("since", values["since"]) if values["since"] else None
    until = parse_time("until", values["until"]) if values["until"] else None
    cursors = {}
    for name in ("before", "after"):
        given = query.get(name)
        if given:
            try:
                cursors[name] = Cursor.decode(given)
            except ValueError:
                raise BadFilter(f"{name}: not a page cursor of this page") from None
    if len(cursors) > 1:
        raise BadFilter("before and after: give one of them")
    return EventsRequest(
        query=EventQuery(
            state=state,
            event=values["event"] or None,
            sink=sink,
            ref=values["q"] or None,
            since=since,
            until=until,
        ),
        before=cursors.get("before"),
        after=cursors.get("after"),
        values=values,
    )
