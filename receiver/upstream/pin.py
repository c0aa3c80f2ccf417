"""The API version the receiver pins, and what happens when the upstream refuses it.

Every upstream request carries ``Service-API-Version: {api.version}``. A 400 whose error body
names the version (its ``code`` or ``param`` mentions the version, or its ``message`` the
header or the pinned date) is a configuration error, not a problem of the event being
processed: :class:`VersionPin` logs it at error level once (not once per request), sets
``receiver_upstream_version_refused`` to 1 and names it in ``/readyz``; the request fails with
:class:`~receiver.errors.VersionRefused`, which is retried with backoff and never ends an event
dead. The next successful answer (the upstream accepts the version again, or a receiver
restarted with a version it accepts) clears all of it.
"""

from __future__ import annotations

from receiver.errors import VersionRefused
from receiver.logs import get_logger
from receiver.observe.metrics import Metrics

log = get_logger("receiver.upstream")

HEADER = "Service-API-Version"


def names_the_version(
    version: str, code: str | None, message: str | None, param: str | None
) -> bool:
    """Whether a 400's error body is about the API version header (or the pinned version)."""
    if code and "version" in code.lower():
        return True
    if param and "version" in param.lower():
        return True
    text = (message or "").lower()
    return HEADER.lower() in text or "api version" in text or bool(version and version in text)


class VersionPin:
    """The pinned version (sent on every request) and whether the upstream refuses it now."""

    def __init__(self, version: str, metrics: Metrics | None = None) -> None:
        self.version = version
        self._metrics = metrics
        #: Why the upstream refused the version, while it does; None once it is accepted.
        self.refused: str | None = None
        if metrics is not None:
            metrics.upstream_version_refused.set(0)

    def refusal(
        self,
        endpoint: str,
        summary: str,
        code: str | None,
        message: str | None,
        param: str | None,
    ) -> VersionRefused | None:
        """The error to raise for a 400 that names the version, else None (another 400)."""
        if not names_the_version(self.version, code, message, param):
            return None
        if self.refused is None:
            log.error(
                "the upstream refuses the pinned API version: set api.version to a version it "
                "accepts and restart the receiver; events wait and are retried meanwhile, none "
                "is lost",
                api_version=self.version,
                endpoint=endpoint,
                code=code,
                upstream_message=message,
            )
        self.refused = message or code or "400"
        if self._metrics is not None:
            self._metrics.upstream_version_refused.set(1)
        return VersionRefused(
            f"the upstream refused the pinned API version {self.version} (api.version): {summary}",
            status=400,
        )

    def accepted(self) -> None:
        """A request carrying the version succeeded."""
        if self.refused is None:
            return
        self.refused = None
        if self._metrics is not None:
            self._metrics.upstream_version_refused.set(0)
        log.info("the upstream accepts the pinned API version again", api_version=self.version)

    def problems(self) -> list[str]:
        """What ``/readyz`` says while the version is refused."""
        if self.refused is None:
            return []
        return [
            f"upstream: the pinned API version {self.version} (api.version, sent as {HEADER}) "
            f"was refused: {self.refused}"
        ]
