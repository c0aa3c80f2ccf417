"""The receiver's exception tree.

Every error the receiver raises on purpose derives from :class:`ReceiverError`; library errors
(aiohttp, sqlite3, asyncpg, broker clients) are translated into one of these at the module that
talks to the library, so callers never see a driver's exception::

    ReceiverError
    ├── ConfigError                 a bad config file or value (names the key)
    ├── SignatureError              a webhook whose signature does not verify (has ``outcome``)
    ├── PayloadError                a verified webhook whose body is not a valid event
    ├── StoreError                  the inbox could not be read or written
    │   ├── StoreUnavailable        the store is down or read-only; intake answers 503
    │   │   └── StoreNewer          a newer release wrote the inbox: this one does not open it
    │   └── StoreDamaged            the SQLite inbox's file is damaged: the receiver does not start
    ├── UnknownEvent                no event with that id in the inbox
    └── DeliveryError               one processing attempt failed (has ``retry_after``)
        ├── TransientError          worth retrying with backoff (5xx, 429, timeouts, not ready)
        │   ├── NotReady            the job or an asset is not finished yet
        │   │   └── UrlRefused      a file's signed URL refused (403, 400, 401, 410): expired?
        │   ├── UpstreamAuthError   the upstream refused the API key (401/403): retried, loud
        │   └── VersionRefused      the upstream refused the pinned api.version: retried, never dead
        └── PermanentError          retrying cannot help (404 job, 410 Gone): dead at once

The docstring of each class is its default message.
"""

from __future__ import annotations

from receiver import __version__


class ReceiverError(Exception):
    """The receiver failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConfigError(ReceiverError):
    """The configuration is not valid."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


class SignatureError(ReceiverError):
    """The webhook signature did not verify."""

    def __init__(self, outcome: str, message: str, *, skew_seconds: float | None = None) -> None:
        self.outcome = outcome
        self.skew_seconds = skew_seconds
        super().__init__(message)


class PayloadError(ReceiverError):
    """The webhook body is not a valid event."""


class StoreError(ReceiverError):
    """The inbox could not be read or written."""


class StoreUnavailable(StoreError):
    """The inbox is unavailable."""


class StoreNewer(StoreUnavailable):
    """The inbox was written by a newer release than this one."""

    def __init__(self, inbox: str, version: int, known: int) -> None:
        self.version = version  # the inbox's schema version
        self.known = known  # the newest this release knows
        super().__init__(
            f"{inbox} has schema version {version}, newer than this receiver knows: a newer "
            f"release wrote it, and this one ({__version__}) knows up to version {known}; "
            "upgrade the receiver or restore a backup taken before that upgrade"
        )


class StoreDamaged(StoreError):
    """The inbox's file is damaged beyond what the receiver repairs at start."""


class UnknownEvent(ReceiverError):
    """No such event in the inbox."""


class DeliveryError(ReceiverError):
    """A processing attempt failed."""

    def __init__(
        self,
        message: str | None = None,
        *,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        self.retry_after = retry_after
        self.status = status  # the upstream's HTTP status, when it answered
        super().__init__(message)


class TransientError(DeliveryError):
    """A processing attempt failed and is worth retrying."""


class NotReady(TransientError):
    """The job or one of its assets is not ready yet."""


class UrlRefused(NotReady):
    """A file's signed URL was refused; it may have expired."""

    def __init__(
        self,
        message: str | None = None,
        *,
        asset_ids: tuple[str, ...] = (),
        retry_after: float | None = None,
    ) -> None:
        self.asset_ids = asset_ids  # the assets whose URLs to fetch again
        super().__init__(message, retry_after=retry_after)


class UpstreamAuthError(TransientError):
    """The upstream refused the API key."""


class VersionRefused(TransientError):
    """The upstream refused the pinned API version (``api.version``)."""


class PermanentError(DeliveryError):
    """A processing attempt failed in a way retrying cannot mend."""
