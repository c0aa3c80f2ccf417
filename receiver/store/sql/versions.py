"""The inbox schema's versions, numbered and described alike by both SQL backends.

Migration N brings an inbox from version N-1 to N, on SQLite (``PRAGMA user_version``) as on
Postgres (a row in ``receiver_schema_migrations``); each backend's ``schema`` module holds its
own statements for it, and the description here is the one both show (``receiver migrate
status``, ``--dry-run``, the migrations table).
"""

from __future__ import annotations

from receiver import __version__
from receiver.errors import StoreUnavailable

DESCRIPTIONS: dict[int, str] = {
    1: "events and deliveries",
    2: "delivery lanes",
    3: "indexes for the inbox page",
    4: "watch list and job outcomes (pull mode)",
    5: "asset ledger (reconcile)",
    6: "event timeline and trace context",
    7: "redelivery batches and lane pauses",
    8: "what a batch's deliveries were before it (cancel withdraws)",
    9: "the ledgers' rows by age (ledger retention)",
}


def pending(version: int, latest: int) -> tuple[tuple[int, str], ...]:
    """The migrations that bring an inbox at ``version`` to ``latest``: (version, description)."""
    return tuple((v, DESCRIPTIONS[v]) for v in range(version + 1, latest + 1))


def behind(inbox: str, version: int, latest: int) -> StoreUnavailable:
    """The error for an inbox this release would have to migrate, when it may not."""
    return StoreUnavailable(
        f"{inbox} has schema version {version}, this release ({__version__}) needs {latest}: "
        "run `receiver migrate` to upgrade it (`receiver migrate status` shows what is "
        "pending), or set store.auto_migrate = true"
    )
