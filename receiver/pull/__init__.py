"""Pull mode: learning of finished jobs without a webhook.

- :mod:`receiver.pull.watch`: the job watch list (``receiver watch``, ``POST /admin/watch``).
- :mod:`receiver.pull.poller`: follows watched jobs with the upstream's long-poll.
- :mod:`receiver.pull.reconcile`: delivers a collection's completed assets no sink got.
- :mod:`receiver.pull.events`: the events poll and reconcile put in the inbox.
- :mod:`receiver.pull.admin`: the admin API's ``/admin/watch``.

Every event made here goes through ``store.add_event`` like a webhook, so the same inbox, dedup
and sinks apply; the job-outcome rule of :mod:`receiver.store.pull` makes each job's outcome
reach each sink once, however many ways it arrived.
"""
