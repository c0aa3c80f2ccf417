"""What the simulated upstream shows clients that poll instead of receiving webhooks.

- Jobs that send no webhook: ``no_webhook_fraction`` of new jobs (or ``add_job(webhook=False)``)
  are never published to the subscriptions, as the upstream does for jobs not attributed to an
  API key; only ``GET /v1/jobs/{id}?wait=true`` finds out when they finish.
- The long-poll's bookkeeping: ``long_polls`` counts ``wait=true`` requests per job,
  ``max_long_polls_in_flight`` the most ever in flight at once for one job (a client that
  polls one job from two places at the same time shows up as 2).
- ``GET /v1/collections/{id}/assets``: a collection's assets, oldest first, paged with the
  spec's ``limit`` (1 to 100, default 50), ``offset`` and ``meta.pagination``.
- 429 bursts: :meth:`PullingState.rate_limit_burst` makes the next N API calls (to one route,
  or any) answer 429 with ``Retry-After``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from receiver.simulator.model import SimAsset

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 100


@dataclass
class _Burst:
    remaining: int
    route: str | None
    retry_after: str | float | None


class PullingState:
    """The mixin of :class:`~receiver.simulator.state.SimulatorState` for polling clients."""

    assets: dict[str, SimAsset]

    def __init__(self) -> None:
        #: The fraction of new jobs that sends no webhook.
        self.no_webhook_fraction = 0.0
        self.long_polls: Counter[str] = Counter()
        self.long_polls_in_flight: Counter[str] = Counter()
        self.max_long_polls_in_flight: Counter[str] = Counter()
        self._bursts: list[_Burst] = []

    def rate_limit_burst(
        self, count: int, *, retry_after: str | float | None = 1, route: str | None = None
    ) -> None:
        """The next ``count`` API calls (to ``route``, e.g. ``"GET /v1/jobs/{id}"``, or any)
        answer 429, with ``Retry-After`` when ``retry_after`` is not None."""
        self._bursts.append(_Burst(count, route, retry_after))

    def take_burst(self, route: str) -> tuple[bool, str | float | None]:
        """Whether this call to ``route`` is one of a burst's 429s, and its Retry-After."""
        for burst in self._bursts:
            if burst.remaining > 0 and burst.route in (None, route):
                burst.remaining -= 1
                return True, burst.retry_after
        self._bursts = [b for b in self._bursts if b.remaining > 0]
        return False, None

    def long_poll_started(self, job_id: str) -> None:
        self.long_polls[job_id] += 1
        self.long_polls_in_flight[job_id] += 1
        self.max_long_polls_in_flight[job_id] = max(
            self.max_long_polls_in_flight[job_id], self.long_polls_in_flight[job_id]
        )

    def long_poll_ended(self, job_id: str) -> None:
        self.long_polls_in_flight[job_id] -= 1

    def collection_assets(self, collection_id: str) -> list[SimAsset]:
        """The collection's assets, oldest first (ties by id): the order pages are cut in."""
        found = [a for a in self.assets.values() if a.collection_id == collection_id]
        return sorted(found, key=lambda a: (a.created, a.id))


def page_params(query: Any) -> tuple[int, int] | None:
    """``limit`` and ``offset`` of a list request, or None when they are not valid."""
    try:
        limit = int(query.get("limit", str(DEFAULT_PAGE_SIZE)))
        offset = int(query.get("offset", "0"))
    except ValueError:
        return None
    if not 1 <= limit <= MAX_PAGE_SIZE or offset < 0:
        return None
    return limit, offset


def pagination(total: int, limit: int, offset: int, returned: int) -> dict[str, Any]:
    """The spec's ``meta`` of a list page."""
    return {
        "pagination": {
            "total": total,
            "limit": limit,
            "offset": offset,
            "has_more": offset + returned < total,
        }
    }
