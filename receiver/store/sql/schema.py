"""Schema statements both SQL dialects run as it is; each backend's ``schema`` module lists its
own migrations, in its own types, around them."""

from __future__ import annotations

# prune (state = 'done', received_at < ...), list by state, counts, oldest pending.
CREATE_INDEX_STATE_RECEIVED = "CREATE INDEX events_state_received ON events (state, received_at)"
# redeliver_dead without scanning every delivery; dead rows are few.
CREATE_INDEX_DEAD = "CREATE INDEX deliveries_dead ON deliveries (event_id) WHERE state = 'dead'"

# Version 3, the inbox page (receiver.store.browse): filter by event name or job id, the latest
# failures, dead letters by sink and error. The partial indexes hold only the rows they serve;
# the last column, state, lets SQLite answer from the index alone (it does not infer the column
# from the index's WHERE).
BROWSE_INDEXES: tuple[str, ...] = (
    "CREATE INDEX events_event_received ON events (event, received_at)",
    "CREATE INDEX events_job ON events (job_id)",
    "CREATE INDEX deliveries_failing ON deliveries (updated_at) WHERE last_error IS NOT NULL",
    "CREATE INDEX deliveries_dead_groups ON deliveries (sink, last_error, updated_at, state)"
    " WHERE state = 'dead'",
)

# An event's steps (its timeline, receiver.store.steps): read by event, trimmed per delivery,
# deleted with the event.
CREATE_INDEX_STEPS = "CREATE INDEX event_steps_event ON event_steps (event_id, sink, seq)"

CREATE_INDEX_WATCHES_SINCE = "CREATE INDEX watches_since ON watches (since)"

# Version 9, ledger retention (receiver.ops.retention): the ledgers' rows by age, so the oldest
# are found without reading them all. Both arrive in time order: appended at the index's end.
LEDGER_AGE_INDEXES: tuple[str, ...] = (
    "CREATE INDEX job_outcomes_created ON job_outcomes (created_at)",
    "CREATE INDEX asset_ledger_created ON asset_ledger (created_at)",
)
