"""Keeps an eye on the upstream's webhook subscriptions from inside ``receiver serve``.

The upstream disables a subscription after 100 consecutive failed deliveries and never enables it
again: the only recovery is to delete it and create a new one. Every
``api.watchdog_interval_seconds`` the :class:`Watchdog` lists the subscriptions
(``GET {base_url}/webhooks``) and

- sets ``receiver_upstream_webhook_active{webhook_id}`` (1 or 0) and
  ``receiver_upstream_webhook_consecutive_failures{webhook_id}``, dropping the series of
  subscriptions that are gone;
- logs a warning when a subscription's ``consecutive_failures`` grew since the last look;
- logs an error for every inactive subscription, naming the commands that recover it and the
  ones that deliver what it missed (``receiver reconcile``, ``receiver watch``).

It runs only when ``api.api_key`` is set (and the interval is not 0). A failing list call is
logged as a warning and tried again at the next interval; it never stops the receiver.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from receiver.errors import ReceiverError
from receiver.logs import get_logger
from receiver.observe.metrics import Metrics
from receiver.upstream.client import UpstreamClient

log = get_logger("receiver.watchdog")


class Watchdog:
    """Polls the subscriptions and exports their health (see the module docstring)."""

    def __init__(self, *, upstream: UpstreamClient, metrics: Metrics, interval: float) -> None:
        self._upstream = upstream
        self._metrics = metrics
        self.interval = interval
        self._failures: dict[str, int] = {}
        #: The subscriptions as last listed, when (unix time), and why the latest look failed.
        self.subscriptions: list[dict[str, Any]] | None = None
        self.checked_at: float | None = None
        self.last_error: str | None = None

    async def check(self) -> list[dict[str, Any]] | None:
        """Look once: update the gauges, log what changed; the subscriptions, or None if the
        list could not be fetched."""
        try:
            hooks = await self._upstream.list_webhooks()
        except ReceiverError as exc:
            log.warning("webhook subscriptions could not be checked", error=exc.message)
            self.last_error = exc.message
            return None
        self.subscriptions, self.checked_at, self.last_error = hooks, time.time(), None
        seen: dict[str, int] = {}
        for hook in hooks:
            webhook_id = str(hook.get("id"))
            active = hook.get("active") is not False
            failures = _as_int(hook.get("consecutive_failures"))
            seen[webhook_id] = failures
            self._metrics.upstream_webhook_active.labels(webhook_id).set(1 if active else 0)
            self._metrics.upstream_webhook_failures.labels(webhook_id).set(failures)
            url = str(hook.get("url"))
            if not active:
                log.error(
                    "upstream webhook subscription is inactive: the upstream no longer sends "
                    "events to it; recover with `receiver webhooks delete "
                    f"{webhook_id}` then `receiver webhooks register --url {url}`; the events "
                    "it missed are never sent again: deliver them with `receiver reconcile "
                    "--collection ID` for each collection (or `receiver watch JOB_ID` for "
                    "jobs still running; docs/pull-mode.md)",
                    webhook_id=webhook_id,
                    url=url,
                    consecutive_failures=failures,
                )
            elif failures > self._failures.get(webhook_id, 0):
                log.warning(
                    "upstream webhook deliveries are failing: at 100 consecutive failures the "
                    "upstream disables the subscription",
                    webhook_id=webhook_id,
                    url=url,
                    consecutive_failures=failures,
                    previously=self._failures.get(webhook_id, 0),
                )
        for gone in set(self._failures) - set(seen):
            self._metrics.upstream_webhook_active.remove(gone)
            self._metrics.upstream_webhook_failures.remove(gone)
        self._failures = seen
        return hooks

    async def run(self) -> None:
        """Check now and then every ``interval`` seconds, until cancelled."""
        log.info("webhook watchdog started", interval_seconds=self.interval)
        while True:
            await self.check()
            await asyncio.sleep(self.interval)


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, (int, float)):
        return int(value)
    return 0
