"""The ``download`` sink: each asset's bytes written atomically under a directory.

Files land at ``{directory}/{collection_id}/{item_name}/{asset_type}-{asset_id}{ext}``, every
component passed through :func:`safe_component`, so a redelivery rewrites the same file and no
name from the payload can leave ``directory``. The URLs come from the upstream's data, so they
are fetched through :class:`~receiver.netguard.GuardedClient` (http(s) only, private addresses
refused unless ``allow_private_networks = true``).

Disk writes: the body is streamed in 64 KiB chunks and written in batches of up to 1 MiB by a
worker thread (``asyncio.to_thread``), as are fsync and rename, so a slow disk (writeback
throttling, a network filesystem) never stalls the event loop. A thread's file is never touched
by the coroutine while the thread runs, even on cancellation (see
:func:`receiver.sinks.atomic_files.in_thread`).
"""

from __future__ import annotations

import asyncio
import glob
import hashlib
import re
import secrets
import time
import unicodedata
from pathlib import Path, PurePosixPath
from typing import IO

import aiohttp
from aiohttp.abc import AbstractResolver
from yarl import URL

from receiver.config.settings import SinkSettings
from receiver.errors import (
    DeliveryError,
    NotReady,
    PermanentError,
    TransientError,
    UrlRefused,
)
from receiver.events import Enriched, FileRef
from receiver.logs import get_logger, redact_url
from receiver.netguard import AddressPolicy, GuardedClient, is_public_address
from receiver.observe.metrics import Metrics
from receiver.observe.timeline import noting
from receiver.retry import parse_retry_after
from receiver.sinks.atomic_files import (
    commit,
    discard,
    in_thread,
    open_temp,
    remove_stale_temp_files,
    write_batch,
)
from receiver.sinks.base import SinkContext

log = get_logger(__name__)

DEFAULT_DIRECTORY = "data/downloads"
DEFAULT_MAX_FILE_BYTES = 1024 * 1024 * 1024
CHUNK_BYTES = 64 * 1024
#: How a file's fetch is named on the event's timeline and trace (its URL is signed).
FILE_ENDPOINT = "{file_url}"
WRITE_BATCH_BYTES = 1024 * 1024
# The spec gives signed URLs no lifetime and no answer for an expired one; object stores answer
# one with 403 (S3, CloudFront, Azure), 400 (Google Cloud Storage), 401 or 410. Each is taken as
# a refused URL: the asset is fetched again for a fresh one, and the delivery retried with
# backoff (dead after max_attempts) should that be refused too.
EXPIRED_URL_STATUSES = frozenset({400, 401, 410})
MAX_COMPONENT_BYTES = 100  # UTF-8 bytes; a file name joins two components, well under 255
UNKNOWN_COLLECTION = "_unknown-collection"
UNNAMED_ITEM = "_unnamed"

CONTENT_TYPE_EXTENSIONS = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/jpg": ".jpg",
    "image/webp": ".webp",
    "image/gif": ".gif",
    "image/avif": ".avif",
    "image/svg+xml": ".svg",
    "video/mp4": ".mp4",
    "video/webm": ".webm",
    "video/quicktime": ".mov",
    "audio/mpeg": ".mp3",
    "audio/wav": ".wav",
    "model/gltf-binary": ".glb",
    "application/json": ".json",
    "application/zip": ".zip",
}
# Suffixes believed from the URL when the server only says application/octet-stream.
URL_SUFFIX_EXTENSIONS = {
    ".png": ".png",
    ".jpg": ".jpg",
    ".jpeg": ".jpg",
    ".webp": ".webp",
    ".gif": ".gif",
    ".avif": ".avif",
    ".mp4": ".mp4",
    ".webm": ".webm",
    ".mov": ".mov",
    ".mp3": ".mp3",
    ".wav": ".wav",
    ".glb": ".glb",
}
FALLBACK_EXTENSION = ".bin"

_WINDOWS_RESERVED = frozenset(
    {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"}
    | {f"{dev}{n}" for dev in ("COM", "LPT") for n in [*"123456789", "¹", "²", "³"]}
)
_UNSAFE_CHARS = frozenset('/\\<>:"|?*')
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})  # controls, bidi, surrogates
_URL_QUERY = re.compile(r"(https?://[^\s?#\"']+)\?[^\s#\"']*")


def safe_component(text: object, *, fallback: str = "_") -> str:
    """One path component made safe; hostile names are rewritten, never refused.

    Separators (``/``, ``\\``), characters Windows forbids, control, format and surrogate
    characters become ``_``; leading dots become ``_`` (so never ``.``, ``..`` or a hidden
    name), trailing dots and spaces are dropped, Windows device names (``CON``, ``com1.txt``)
    get a ``_`` prefix, and a name longer than 100 UTF-8 bytes is cut with an 8-hex hash of the
    whole so distinct long names stay distinct. Empty becomes ``fallback``.
    """
    raw = unicodedata.normalize("NFC", str(text))
    chars = [
        "_" if ch in _UNSAFE_CHARS or unicodedata.category(ch) in _UNSAFE_CATEGORIES else ch
        for ch in raw
    ]
    name = "".join(chars).strip()
    stripped = name.lstrip(".")
    name = "_" * (len(name) - len(stripped)) + stripped
    name = name.rstrip(". ")
    if not name:
        return fallback
    if name.split(".", 1)[0].rstrip(" ").upper() in _WINDOWS_RESERVED:
        name = f"_{name}"
    encoded = name.encode("utf-8")
    if len(encoded) > MAX_COMPONENT_BYTES:
        digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        head = encoded[: MAX_COMPONENT_BYTES - 9].decode("utf-8", "ignore").rstrip(". ")
        name = f"{head}~{digest}"
    return name


def file_parts(ref: FileRef) -> tuple[str, str, str]:
    """The safe ``(collection, item, stem)`` of a file; the extension comes from the response."""
    collection = safe_component(ref.collection_id) if ref.collection_id else UNKNOWN_COLLECTION
    item = safe_component(ref.item_name) if ref.item_name else UNNAMED_ITEM
    stem = f"{safe_component(ref.asset_type)}-{safe_component(ref.asset_id)}"
    return collection, item, stem


def has_file(directory: Path, collection_id: str | None, asset_type: str, asset_id: str) -> bool:
    """Whether a download sink writing to ``directory`` holds the file of this asset (under any
    item name and extension: the path is built as :func:`file_parts` builds it)."""
    collection = safe_component(collection_id) if collection_id else UNKNOWN_COLLECTION
    stem = f"{safe_component(asset_type)}-{safe_component(asset_id)}"
    matches = (directory / collection).glob(f"*/{glob.escape(stem)}*")
    return any(p.name == stem or p.name.startswith(f"{stem}.") for p in matches if p.is_file())


def extension_for(content_type: str, *urls: URL | str) -> str:
    """The file extension for a response's content type, else a known media suffix of a URL."""
    mime = content_type.split(";", 1)[0].strip().lower()
    if mime in CONTENT_TYPE_EXTENSIONS:
        return CONTENT_TYPE_EXTENSIONS[mime]
    for url in urls:
        try:
            path = URL(url).path if isinstance(url, str) else url.path
        except (ValueError, TypeError):
            continue
        suffix = PurePosixPath(path).suffix.lower()
        if suffix in URL_SUFFIX_EXTENSIONS:
            return URL_SUFFIX_EXTENSIONS[suffix]
    return FALLBACK_EXTENSION


def _scrub(text: str) -> str:
    return _URL_QUERY.sub(r"\1?<redacted>", text)


class DownloadSink:
    """Writes every file of an event under ``directory``, atomically.

    Options: ``directory``, ``allow_private_networks``, ``max_file_bytes``. Files of one event
    are fetched one after the other; a file not ready yet (404) or whose URL was refused (403,
    or :data:`EXPIRED_URL_STATUSES`) does not stop the others, any other failure ends the
    attempt. ``bytes_written`` and ``files_written`` count what this sink has written (also
    exported as ``receiver_downloaded_bytes_total``). ``address_policy`` and ``resolver`` are
    for tests: which addresses count as public, and the resolver the guard wraps.
    """

    def __init__(
        self,
        settings: SinkSettings,
        *,
        address_policy: AddressPolicy = is_public_address,
        resolver: AbstractResolver | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        options = settings.options
        self.name = settings.name
        self.settings = settings
        self.directory = Path(str(options.get("directory") or DEFAULT_DIRECTORY))
        self.allow_private = bool(options.get("allow_private_networks", False))
        self.max_file_bytes = int(options.get("max_file_bytes") or DEFAULT_MAX_FILE_BYTES)
        self.bytes_written = 0
        self.files_written = 0
        self._bytes_metric = metrics.downloaded_bytes.labels(self.name) if metrics else None
        self._policy = address_policy
        self._resolver = resolver
        self._client: GuardedClient | None = None
        self._root: Path | None = None
        self._sweep: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Create the directory and the sink's own guarded HTTP session."""
        if self._client is None:
            self._client = GuardedClient(
                allow_private=self.allow_private,
                is_allowed=self._policy,
                resolver=self._resolver,
            )
            self._client.open()
        await in_thread(self.directory.mkdir, 0o777, True, True)
        self._root = await in_thread(self.directory.resolve)
        if self._sweep is None:
            # In the background: a large download tree must not delay the start.
            self._sweep = asyncio.create_task(self._remove_stale(self._root))

    async def _remove_stale(self, root: Path) -> None:
        removed = await asyncio.to_thread(remove_stale_temp_files, root, time.time())
        if removed:
            log.info("removed temporary files left by an interrupted run", count=removed)

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._sweep is not None and not self._sweep.done():
            await asyncio.wait({self._sweep})
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def send(self, enriched: Enriched) -> None:
        """Download every file of the event; raise a DeliveryError when one failed."""
        if self._client is None or self._root is None:
            await self.open()
        not_ready: list[NotReady] = []
        refused: list[str] = []
        for ref in enriched.files:
            try:
                async with asyncio.timeout(self.settings.timeout_seconds):
                    await self._download(ref)
            except NotReady as exc:
                not_ready.append(exc)  # the others may be ready: fetch them now
                if isinstance(exc, UrlRefused):
                    refused.append(ref.asset_id)
            except TimeoutError:
                raise TransientError(
                    f"asset {ref.asset_type} {ref.asset_id}: timed out after "
                    f"{self.settings.timeout_seconds:g} s"
                ) from None
        if not_ready:
            message = "; ".join(e.message for e in not_ready)
            retry_after = max((e.retry_after or 0.0 for e in not_ready), default=0.0) or None
            if refused:
                # The caller fetches those assets' URLs again before the next attempt.
                raise UrlRefused(message, asset_ids=tuple(refused), retry_after=retry_after)
            raise NotReady(message, retry_after=retry_after)

    def target(self, ref: FileRef, ext: str) -> Path:
        """Where ``ref`` is written once its extension is known; never outside the directory."""
        assert self._root is not None
        collection, item, stem = file_parts(ref)
        path = self._root / collection / item / f"{stem}{ext}"
        # Defence in depth: the components are already safe, but a symlink could still lead out.
        if not path.resolve().is_relative_to(self._root):
            raise PermanentError(f"refused: {collection}/{item}/{stem}{ext} leaves the directory")
        return path

    async def _download(self, ref: FileRef) -> None:
        assert self._client is not None
        what = f"asset {ref.asset_type} {ref.asset_id}"
        # Stalls are caught here; the whole file is bounded by send()'s asyncio.timeout.
        limit = self.settings.timeout_seconds
        stall = aiohttp.ClientTimeout(
            total=None, sock_connect=min(10.0, limit), sock_read=min(30.0, limit)
        )
        with noting("GET", FILE_ENDPOINT, ref.url) as call:  # for the event's timeline
            try:
                response = await self._client.get(ref.url, client_timeout=stall)
            except DeliveryError as exc:
                if isinstance(exc, PermanentError) and exc.message.startswith("refused"):
                    log.warning("download refused", reason=exc.message, url=redact_url(ref.url))
                raise type(exc)(f"{what}: {exc.message}", retry_after=exc.retry_after) from exc
            async with response:
                call.status = str(response.status)
                self._check_status(response, what)
                length = response.content_length
                if length is not None and length > self.max_file_bytes:
                    raise PermanentError(
                        f"{what}: {length} bytes exceeds max_file_bytes ({self.max_file_bytes})"
                    )
                ext = extension_for(response.content_type, response.url, ref.url)
                path = self.target(ref, ext)
                size = await self._stream_to(path, response, what)
        self.bytes_written += size
        self.files_written += 1
        if self._bytes_metric is not None:
            self._bytes_metric.inc(size)
        log.info(
            "file written",
            path=str(path.relative_to(self._root or self.directory)),
            bytes=size,
            asset_type=ref.asset_type,
            asset_id=ref.asset_id,
            url=redact_url(ref.url),
        )

    def _check_status(self, response: aiohttp.ClientResponse, what: str) -> None:
        status = response.status
        if status == 200:
            return
        if status == 403:  # the signed URL expired, or the file does not exist yet
            raise UrlRefused(f"{what} file not ready (HTTP 403)")
        if status in EXPIRED_URL_STATUSES:
            raise UrlRefused(f"{what} file URL refused (HTTP {status}): it may have expired")
        if status == 404:
            raise NotReady(f"{what} file not ready (HTTP 404)")
        if status == 429:
            raise TransientError(
                f"{what}: rate limited (HTTP 429)",
                retry_after=parse_retry_after(response.headers.get("Retry-After")),
                status=429,
            )
        if status >= 500:
            raise TransientError(f"{what}: HTTP {status}")
        raise PermanentError(f"{what}: HTTP {status}")

    async def _stream_to(self, path: Path, response: aiohttp.ClientResponse, what: str) -> int:
        temp = path.parent / f".{path.name}.tmp-{secrets.token_hex(6)}"
        opened: list[IO[bytes]] = []
        committed = False
        try:
            await in_thread(open_temp, temp, opened)
            handle = opened[0]
            total = 0
            batch: list[bytes] = []
            batched = 0
            async for chunk in response.content.iter_chunked(CHUNK_BYTES):
                total += len(chunk)
                if total > self.max_file_bytes:
                    raise PermanentError(
                        f"{what}: larger than max_file_bytes ({self.max_file_bytes})"
                    )
                batch.append(chunk)
                batched += len(chunk)
                if batched >= WRITE_BATCH_BYTES:
                    await in_thread(write_batch, handle, batch)
                    batch, batched = [], 0
            if batch:
                await in_thread(write_batch, handle, batch)
            committed = True  # from here commit owns the temp file, failure included
            await in_thread(commit, handle, temp, path)
            return total
        except (aiohttp.ClientError, OSError) as exc:
            if isinstance(exc, OSError) and not isinstance(exc, aiohttp.ClientError):
                raise TransientError(f"{what}: cannot write file: {exc.strerror or exc}") from exc
            raise TransientError(
                f"{what}: download interrupted: {_scrub(str(exc)) or type(exc).__name__}"
            ) from exc
        finally:
            if not committed:
                await in_thread(discard, opened[0] if opened else None, temp)


def create(settings: SinkSettings, context: SinkContext) -> DownloadSink:
    """The sink for a ``type = "download"`` table (it owns its own guarded HTTP session)."""
    return DownloadSink(settings, metrics=context.metrics)
