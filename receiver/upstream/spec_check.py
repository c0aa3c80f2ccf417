"""Noticing when the upstream changes: its OpenAPI document read and compared, now and then.

:func:`check_upstream` reads ``{base_url}/openapi.json`` once and compares it with the baseline
(:mod:`receiver.upstream.drift`): what ``receiver upstream check`` prints.

Inside ``receiver serve`` (processes that run workers, with an ``api.api_key``) a
:class:`SpecCheck` does it at start and every ``api.spec_check_minutes`` (0: only at start), as
a background task: nothing waits for it, events included. Each look

- keeps its :class:`~receiver.upstream.drift.DriftReport` as :attr:`SpecCheck.report` (the
  runtime shows it as ``Runtime.upstream_drift``);
- sets ``receiver_upstream_spec_info{revision,api_version}`` to 1 for the revision read (the
  series of an earlier revision goes) and ``receiver_upstream_drift{severity}`` to the number of
  findings of each severity;
- logs a warning for each breaking finding not seen before (once, not at every look), and an
  info line for each new notice.

A document that cannot be read (unreachable, slow, too large, not JSON, not OpenAPI, a broken
``$ref`` on the way to a field the receiver reads) is logged at warning level; the report then
carries the error beside the findings of the last document read, and the metrics keep
describing that document.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from receiver.config.settings import ApiSettings, Settings
from receiver.logs import get_logger
from receiver.observe.metrics import Metrics
from receiver.upstream.drift import DriftReport, compare
from receiver.upstream.openapi import SpecError
from receiver.upstream.spec_source import baseline, read_upstream_document

log = get_logger("receiver.upstream")

#: After a look that could not read the document, the next one comes this much sooner
#: (doubling with each failure, at most MAX_RETRY_SECONDS or the regular interval).
RETRY_SECONDS = 30.0
MAX_RETRY_SECONDS = 3600.0


async def check_upstream(
    session: aiohttp.ClientSession,
    api: ApiSettings,
    *,
    metrics: Metrics | None = None,
    clock: Callable[[], float] = time.time,
) -> DriftReport:
    """One look: the upstream's document read and compared (``error`` set when it could not
    be read)."""
    base = baseline()
    try:
        document = await read_upstream_document(session, api, metrics=metrics)
        findings = compare(base, document)
    except SpecError as exc:
        return DriftReport(None, api.version, clock(), base.revision, error=exc.message)
    return DriftReport(document.revision, api.version, clock(), base.revision, findings=findings)


class SpecCheck:
    """The upstream's document, compared at start and every ``api.spec_check_minutes``."""

    def __init__(
        self,
        *,
        settings: Settings,
        session: aiohttp.ClientSession,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = settings.api
        self._session = session
        self._metrics = metrics
        self._clock = clock
        #: Seconds between looks; 0: only the look at start.
        self.interval = settings.api.spec_check_minutes * 60
        #: The latest look (None until the first one ends).
        self.report: DriftReport | None = None
        self._good: DriftReport | None = None
        self._told: set[tuple[str, str]] = set()
        self._checked = asyncio.Event()

    @staticmethod
    def wanted(settings: Settings, runs_workers: bool) -> bool:
        """Whether a process with these settings checks: one that calls the upstream."""
        return runs_workers and bool(settings.api.api_key)

    async def check(self) -> DriftReport:
        """Look once (see the module docstring); the report."""
        found = await check_upstream(
            self._session, self._api, metrics=self._metrics, clock=self._clock
        )
        if found.error is not None:
            log.warning(
                "the upstream's OpenAPI document could not be read; the last one read is kept",
                error=found.error,
                last_revision=self._good.revision if self._good else None,
            )
            if self._good is not None:
                found = DriftReport(
                    self._good.revision,
                    found.api_version,
                    found.checked_at,
                    found.baseline,
                    error=found.error,
                    findings=list(self._good.findings),
                )
        else:
            self._take(found)
        self.report = found
        self._checked.set()
        return found

    async def wait_checked(self) -> DriftReport:
        """The report, once the first look has ended."""
        await self._checked.wait()
        assert self.report is not None
        return self.report

    async def run(self) -> None:
        """Look now and then every ``interval`` seconds (after the first look only, when 0),
        until cancelled. A look that could not read the document is tried again sooner: after
        ``RETRY_SECONDS``, doubling each time, never later than the next regular look (an
        upstream answering 429 or 503 at start is not left unread for an hour)."""
        log.info("upstream drift check started", interval_minutes=self._api.spec_check_minutes)
        failures = 0
        while True:
            report = await self.check()
            if report.error is None:
                failures = 0
                if self.interval <= 0:
                    await asyncio.Event().wait()  # nothing more to do; ends when cancelled
                await asyncio.sleep(self.interval)
                continue
            failures += 1
            retry = RETRY_SECONDS * 2 ** min(failures - 1, 10)
            await asyncio.sleep(min(retry, self.interval or MAX_RETRY_SECONDS, MAX_RETRY_SECONDS))

    def _take(self, report: DriftReport) -> None:
        previous, self._good = self._good, report
        info = self._metrics.upstream_spec_info
        if previous is not None and previous.revision != report.revision:
            info.remove(str(previous.revision), previous.api_version)
        info.labels(str(report.revision), report.api_version).set(1)
        for severity, count in report.counts().items():
            self._metrics.upstream_drift.labels(severity).set(count)
        for finding in report.findings:
            if (finding.where, finding.change) in self._told:
                continue
            self._told.add((finding.where, finding.change))
            say = log.warning if finding.severity == "breaking" else log.info
            say(
                f"upstream drift ({finding.severity}): {finding.where}: {finding.change}",
                severity=finding.severity,
                where=finding.where,
                change=finding.change,
                revision=report.revision,
                baseline=report.baseline,
            )
        if not report.findings:
            log.info(
                "the upstream's OpenAPI document matches what the receiver reads",
                revision=report.revision,
            )
