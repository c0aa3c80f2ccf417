"""The job watch list: adding jobs to it, checked once for every way in (CLI, admin API)."""

from __future__ import annotations

from collections.abc import Sequence

from receiver.config.settings import Settings
from receiver.store.base import Store
from receiver.store.pull import WatchRecord, valid_job_id


class BadJobId(ValueError):
    """A job id that is not a UUID: refused before anything is stored."""

    def __init__(self, job_id: object) -> None:
        self.job_id = job_id
        super().__init__(f"{str(job_id)[:80]!r} is not a job id (a UUID)")


def check_job_ids(job_ids: Sequence[object]) -> list[str]:
    """The ids, normalised to lower case; BadJobId for the first one that is not a UUID."""
    for job_id in job_ids:
        if not valid_job_id(job_id):
            raise BadJobId(job_id)
    return [str(job_id).lower() for job_id in job_ids]


async def watch_jobs(
    store: Store, settings: Settings, job_ids: Sequence[object], *, now: float
) -> list[WatchRecord]:
    """Put the jobs on the durable watch list (all or none: every id is checked first)."""
    ids = check_job_ids(job_ids)
    expires_at = now + settings.pull.watch_expiry_hours * 3600
    return await store.add_watches(ids, now=now, expires_at=expires_at)
