"""The upstream's webhook subscriptions: register, list, delete (``receiver webhooks ...``).

Registering stores the secret the upstream shows once in ``webhook.secrets_file`` (created 0600,
one secret a line, appended, so the previous secret stays valid during a rotation). The file is
checked to be writable *before* the subscription is created, and if writing the secret still
fails the new subscription is deleted again: a subscription whose secret nobody has would only
produce refused deliveries and count towards the upstream's disable-at-100 rule.

Every failure becomes a :class:`~receiver.errors.ReceiverError` (or ``ConfigError``) whose
message is one line that says what to fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from receiver.config.settings import Settings
from receiver.errors import (
    ConfigError,
    PermanentError,
    ReceiverError,
    TransientError,
    UpstreamAuthError,
)
from receiver.logs import redact_url
from receiver.secrets import append_secret
from receiver.upstream.client import UpstreamClient

T = TypeVar("T")
#: Tries of one upstream call answered with 429 or 5xx.
_ATTEMPTS = 4
_MAX_WAIT_SECONDS = 10.0


class SubscriptionError(ReceiverError):
    """The webhook subscription could not be managed."""


@dataclass(frozen=True)
class Registered:
    """A new subscription: what the upstream answered and where its secret went."""

    webhook: dict[str, Any]
    secret: str
    secrets_file: Path | None
    same_url: tuple[str, ...]  # ids of older subscriptions to the same URL
    loose_permissions: bool  # the secrets file existed and others may read it


@asynccontextmanager
async def upstream_client(settings: Settings) -> AsyncIterator[UpstreamClient]:
    """An API client for ``api.base_url`` with ``api.api_key``; ConfigError when there is none."""
    if not settings.api.api_key:
        raise ConfigError(
            "api.api_key: not set; managing webhooks needs the upstream API key "
            "(set api.api_key or RECEIVER_API_KEY)"
        )
    async with aiohttp.ClientSession() as session:
        yield UpstreamClient(
            session=session,
            base_url=settings.api.base_url,
            api_key=settings.api.api_key,
            timeout=settings.api.timeout_seconds,
            api_version=settings.api.version,
        )


async def register(
    settings: Settings, url: str, events: list[str] | None, *, show_secret: bool = False
) -> Registered:
    """Create a subscription for ``url``; append its secret to ``webhook.secrets_file``.

    Without a secrets file the secret can only be shown, so ``show_secret`` must be set;
    otherwise nothing is created and ConfigError says which key to set.
    """
    if not url.startswith(("http://", "https://")):
        raise SubscriptionError(f"--url must be an http(s) URL, not {url!r}")
    path = Path(settings.webhook.secrets_file) if settings.webhook.secrets_file else None
    if path is None and not show_secret:
        raise ConfigError(
            "webhook.secrets_file: not set; set it so the new secret can be stored "
            "(or pass --show-secret to print the secret instead)"
        )
    loose = False
    if path is not None:
        loose = _prepare_secrets_file(path)
    async with upstream_client(settings) as client:
        same_url: tuple[str, ...] = ()
        try:
            # Only for a note about older subscriptions to this URL: not worth failing over.
            with contextlib.suppress(TransientError, PermanentError):
                existing = await _patiently(client.list_webhooks)
                same_url = tuple(str(h.get("id")) for h in existing if h.get("url") == url)
            # A 429 was not acted upon, so asking again is safe; after a 5xx the subscription
            # may exist already, and its secret is shown only once: no second try then.
            created = await _patiently(
                lambda: client.create_webhook(url, events), repeatable=lambda e: e.status == 429
            )
        except ReceiverError as exc:
            if _may_have_written(exc):
                raise SubscriptionError(
                    f"{exc.message}; a subscription may have been created anyway, without its "
                    "secret: check `receiver webhooks list` and delete any you do not know"
                ) from None
            raise _explain(exc, settings) from None
        secret = created.get("secret")
        webhook_id = created.get("id")
        if not isinstance(secret, str) or not secret or not isinstance(webhook_id, str):
            raise SubscriptionError("the upstream's answer has no webhook id or secret")
        if path is not None:
            try:
                append_secret(path, secret)
            except OSError as exc:
                await _undo(client, webhook_id)
                raise SubscriptionError(
                    f"{path}: the secret could not be written ({exc.strerror}); "
                    f"webhook {webhook_id} was deleted again"
                ) from None
    return Registered(
        webhook=created,
        secret=secret,
        secrets_file=path,
        same_url=same_url,
        loose_permissions=loose,
    )


async def list_subscriptions(settings: Settings) -> list[dict[str, Any]]:
    """Every subscription the API key's account has (all pages)."""
    async with upstream_client(settings) as client:
        try:
            return await _patiently(client.list_webhooks)
        except ReceiverError as exc:
            raise _explain(exc, settings) from None


async def delete(settings: Settings, webhook_id: str) -> None:
    """Delete one subscription; its secret stays in the secrets file until removed by hand."""
    async with upstream_client(settings) as client:
        try:
            await _patiently(lambda: client.delete_webhook(webhook_id))
        except PermanentError as exc:
            if exc.status == 404:
                raise SubscriptionError(
                    f"no webhook {webhook_id} upstream (see receiver webhooks list)"
                ) from None
            raise _explain(exc, settings) from None
        except ReceiverError as exc:
            raise _explain(exc, settings) from None


def _may_have_written(exc: ReceiverError) -> bool:
    """Whether a failed create may have been carried out all the same: a 5xx ("a write may
    have committed"), or no answer after the request went out (a timeout does not cancel a
    write)."""
    if not isinstance(exc, TransientError):
        return False
    if exc.status is not None:
        return exc.status >= 500
    return isinstance(exc.__cause__, (TimeoutError, aiohttp.ServerDisconnectedError))


async def _patiently(
    call: Callable[[], Awaitable[T]],
    *,
    repeatable: Callable[[TransientError], bool] = lambda exc: exc.status is not None,
) -> T:
    """``call()``, asked again after a transient answer (429, 5xx) that ``repeatable`` allows.

    Waits ``Retry-After`` when the upstream sent one, else 0.5 s, 1 s, 2 s. A refused key, a
    timeout or an upstream that cannot be reached is reported at once.
    """
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            return await call()
        except UpstreamAuthError:
            raise
        except TransientError as exc:
            if attempt == _ATTEMPTS or not repeatable(exc):
                raise
            wait = exc.retry_after if exc.retry_after is not None else 0.5 * 2 ** (attempt - 1)
            await asyncio.sleep(min(wait, _MAX_WAIT_SECONDS))
    raise AssertionError("unreachable")


def _prepare_secrets_file(path: Path) -> bool:
    """Create the file (0600) if needed and check it can be appended to; True if others can
    read an existing one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            mode = os.fstat(fd).st_mode
        finally:
            os.close(fd)
    except OSError as exc:
        raise SubscriptionError(
            f"webhook.secrets_file {path} cannot be written ({exc.strerror}); nothing was created"
        ) from None
    return bool(stat.S_IMODE(mode) & 0o077)


async def _undo(client: UpstreamClient, webhook_id: str) -> None:
    with contextlib.suppress(ReceiverError):  # the error about the secret is the one to report
        await client.delete_webhook(webhook_id)


def _explain(exc: ReceiverError, settings: Settings) -> ReceiverError:
    """The upstream's error with what to check."""
    if isinstance(exc, UpstreamAuthError):
        return SubscriptionError(f"{exc.message} (check api.api_key or RECEIVER_API_KEY)")
    if isinstance(exc, TransientError) and "failed:" in exc.message:
        return SubscriptionError(
            f"{exc.message}; is api.base_url ({redact_url(settings.api.base_url)}) right?"
        )
    return exc
