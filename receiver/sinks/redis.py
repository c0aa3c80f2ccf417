"""The ``redis`` sink: each event appended to a Redis stream with ``XADD``.

An entry has three fields: ``event_id``, ``event`` (the event name) and ``data`` (the enriched
event as JSON; with ``envelope = "cloudevents"``, the CloudEvent in the JSON event format, see
:mod:`receiver.outbound.envelopes`), and with tracing on a fourth, ``traceparent`` (the delivery
attempt's W3C trace context). ``maxlen`` trims the stream approximately (``MAXLEN ~``),
which Redis does cheaply, a whole node at a time.

A redelivery must not add a second entry. One Lua script, atomic on the server, checks a marker
key ``{stream}:dedup:{event_id}`` and only when it is absent adds the entry and sets the marker
(holding the entry id) with a TTL of ``dedup_seconds`` (default: the inbox's retention, as long
as the receiver itself can redeliver the event). One round trip, and no window in which a crash
leaves an entry without its marker. ``dedup_seconds = 0`` turns this off.

The client reconnects by itself: after a Redis restart the next command opens a new connection
(retried once at once, so a stale pooled connection costs no attempt); while Redis is down,
each attempt fails fast and the worker backs off.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

from receiver.config.settings import SinkSettings
from receiver.errors import PermanentError, TransientError
from receiver.events import Enriched
from receiver.logs import get_logger, redact_url
from receiver.outbound.envelopes import Envelope, trace_headers
from receiver.sinks.base import SinkContext

log = get_logger(__name__)

# KEYS: stream, marker. ARGV: dedup ttl (0 = off), maxlen (0 = none), event_id, event, data,
# then more field, value pairs (traceparent). Returns {1, entry id} when added, {0, entry id of
# the earlier add} for a redelivery.
ADD_ONCE = """
if tonumber(ARGV[1]) > 0 then
  local seen = redis.call('GET', KEYS[2])
  if seen then return {0, seen} end
end
local fields = {'event_id', ARGV[3], 'event', ARGV[4], 'data', ARGV[5]}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
local id
if tonumber(ARGV[2]) > 0 then
  id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(fields))
else
  id = redis.call('XADD', KEYS[1], '*', unpack(fields))
end
if tonumber(ARGV[1]) > 0 then
  redis.call('SET', KEYS[2], id, 'EX', ARGV[1])
end
return {1, id}
"""


def marker_key(stream: str, event_id: str) -> str:
    """The key remembering that ``event_id`` was added to ``stream``."""
    return f"{stream}:dedup:{event_id}"


class RedisStreamSink:
    """Adds each event to a stream. Options: ``url``, ``stream``, ``maxlen``, ``dedup_seconds``,
    ``envelope``, ``cloudevents_source``."""

    def __init__(self, settings: SinkSettings, *, default_dedup_seconds: int) -> None:
        options = settings.options
        self.name = settings.name
        self.settings = settings
        self.stream = str(options["stream"])
        self.maxlen = int(options.get("maxlen") or 0)
        dedup = options.get("dedup_seconds")
        self.dedup_seconds = default_dedup_seconds if dedup is None else int(dedup)
        self._envelope = Envelope(options)
        self._url = str(options["url"])
        self._shown_url = redact_url(self._url)
        self._client: Any = None
        self._script: Any = None

    def _connect(self) -> Any:
        if self._client is None:
            timeout = self.settings.timeout_seconds
            self._client = aioredis.from_url(
                self._url,
                socket_timeout=timeout,
                socket_connect_timeout=min(timeout, 10.0),
                retry=Retry(NoBackoff(), 1),
                health_check_interval=30,
            )
            self._script = self._client.register_script(ADD_ONCE)
        return self._client

    async def open(self) -> None:
        """Create the client and check Redis answers; a Redis that is down is only logged."""
        client = self._connect()
        try:
            await client.ping()
        except RedisError as exc:
            log.warning(
                "redis is not reachable yet; deliveries will retry",
                sink=self.name,
                url=self._shown_url,
                error=str(exc),
            )

    async def close(self) -> None:
        """Close the client's connections."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def send(self, enriched: Enriched) -> None:
        """Add the event to the stream unless an earlier attempt already did."""
        self._connect()
        try:
            added, entry_id = await self._script(
                keys=[self.stream, marker_key(self.stream, enriched.event_id)],
                args=[
                    self.dedup_seconds,
                    self.maxlen,
                    enriched.event_id,
                    enriched.event_name,
                    self._envelope.structured(enriched),
                    *(item for pair in trace_headers(enriched).items() for item in pair),
                ],
            )
        except ResponseError as exc:
            message = f"redis {self._shown_url} stream {self.stream}: {exc}"
            if str(exc).startswith("WRONGTYPE"):
                raise PermanentError(message) from None
            raise TransientError(message) from None
        except RedisError as exc:
            raise TransientError(f"redis {self._shown_url}: {type(exc).__name__}: {exc}") from None
        if not added:
            log.info(
                "already in the stream; not added again",
                sink=self.name,
                stream=self.stream,
                entry_id=entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
            )


def create(settings: SinkSettings, context: SinkContext) -> RedisStreamSink:
    retention = int(context.settings.store.retention_hours * 3600)
    return RedisStreamSink(settings, default_dedup_seconds=retention)
