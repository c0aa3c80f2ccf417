"""Every row of the contract's status table, against a real aiohttp listener and SQLite inbox."""

import gzip
import json
import time

import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.errors import PayloadError, StoreUnavailable
from receiver.intake.endpoint import ClientAddress
from receiver.signature import sign, webhook_headers
from receiver.store.memory import MemoryStore

SECRET = "whsec_intake_test"
OLD_SECRET = "whsec_previous"


def payload(event_id="evt-1", **extra):
    body = {
        "id": event_id,
        "object": "event",
        "event": "job.completed",
        "job_id": "job-1",
        "type": "image",
        "asset_ids": {"image": "a-1"},
    }
    body.update(extra)
    return json.dumps(body).encode()


def signed(body, *, secret=SECRET, timestamp=None, event_id="evt-1"):
    return webhook_headers(
        secret, body, int(timestamp or time.time()), event_id=event_id, event_name="job.completed"
    )


def settings_for(tmp_path, **server):
    return parse_settings(
        {
            "webhook": {"secrets": [OLD_SECRET, SECRET]},
            "server": {"max_body_bytes": 4096, **server},
            "store": {"url": f"sqlite:///{tmp_path}/inbox.db"},
            "sinks": [
                {"name": "files", "type": "download", "directory": str(tmp_path / "dl")},
                {
                    "name": "failed-only",
                    "type": "download",
                    "events": ["job.failed"],
                    "directory": str(tmp_path / "dl2"),
                },
            ],
        },
        env={},
    )


@pytest.fixture
async def receiver(aiohttp_client, tmp_path):
    runtime = Runtime(settings_for(tmp_path), role="intake")
    async with runtime:
        client = await aiohttp_client(runtime.public_app())
        yield runtime, client


def sample(runtime, name, labels):
    return runtime.metrics.registry.get_sample_value(name, labels) or 0.0


async def post(client, body, headers):
    response = await client.post("/webhooks", data=body, headers=headers)
    return response.status, await response.json()


async def test_valid_event_is_stored_before_the_2xx(receiver):
    runtime, client = receiver
    body = payload()
    status, answer = await post(client, body, signed(body))
    assert status == 200
    assert answer == {"received": True, "id": "evt-1", "duplicate": False}
    record = await runtime.store.get("evt-1")
    assert record is not None and record.body == body
    # Only the sink whose event filter matches gets a delivery row.
    assert [d.sink for d in record.deliveries] == ["files"]
    assert record.headers["Service-Event-Id"] == "evt-1"
    assert sample(runtime, "receiver_webhook_requests_total", {"outcome": "accepted"}) == 1
    assert sample(runtime, "receiver_webhook_secret_matches_total", {"secret_index": "1"}) == 1
    assert sample(runtime, "receiver_signature_skew_seconds_count", {}) == 1


async def test_duplicate_is_2xx_and_stored_once(receiver):
    runtime, client = receiver
    body = payload()
    assert (await post(client, body, signed(body)))[0] == 200
    status, answer = await post(client, body, signed(body))
    assert status == 200 and answer["duplicate"] is True
    assert len(await runtime.store.list()) == 1
    assert sample(runtime, "receiver_webhook_requests_total", {"outcome": "duplicate"}) == 1


async def test_missing_service_event_id_is_fine(receiver):
    _runtime, client = receiver
    body = payload()
    headers = signed(body)
    del headers["Service-Event-Id"]
    assert (await post(client, body, headers))[0] == 200


async def expect_rejected(runtime, client, body, headers, status, code, outcome):
    got_status, answer = await post(client, body, headers)
    assert got_status == status, answer
    assert answer["error"]["code"] == code
    assert answer["error"]["message"]
    assert await runtime.store.list() == []
    assert sample(runtime, "receiver_webhook_requests_total", {"outcome": outcome}) == 1


async def test_missing_signature(receiver):
    body = payload()
    headers = signed(body)
    del headers["Service-Signature"]
    await expect_rejected(*receiver, body, headers, 401, "missing_signature", "missing_signature")


async def test_unparseable_signature(receiver):
    body = payload()
    headers = {**signed(body), "Service-Signature": "not a signature"}
    await expect_rejected(*receiver, body, headers, 401, "invalid_signature", "invalid_signature")


async def test_wrong_secret(receiver):
    body = payload()
    await expect_rejected(
        *receiver, body, signed(body, secret="nope"), 401, "invalid_signature", "invalid_signature"
    )


async def test_legacy_signature_refused_by_default(receiver):
    body = payload()
    headers = signed(body)
    del headers["Service-Signature"]
    await expect_rejected(*receiver, body, headers, 401, "missing_signature", "missing_signature")


@pytest.mark.parametrize("offset", [-301, 400])
async def test_stale_timestamp_logged_with_skew(receiver, offset):
    body = payload()
    with capture_logs() as logs:
        await expect_rejected(
            *receiver,
            body,
            signed(body, timestamp=time.time() + offset),
            401,
            "stale_timestamp",
            "stale_timestamp",
        )
    rejected = [line for line in logs if line["event"] == "webhook rejected"]
    assert rejected[0]["outcome"] == "stale_timestamp"
    assert abs(rejected[0]["skew_seconds"] + offset) <= 2


async def test_body_too_large_by_content_length(receiver):
    body = payload(padding="x" * 5000)
    await expect_rejected(*receiver, body, signed(body), 413, "payload_too_large", "too_large")


async def test_body_too_large_chunked(receiver):
    runtime, client = receiver
    body = payload(padding="x" * 5000)

    async def chunks():
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    response = await client.post("/webhooks", data=chunks(), headers=signed(body))
    assert response.status == 413
    assert (await response.json())["error"]["code"] == "payload_too_large"
    assert await runtime.store.list() == []


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"\xff\xfe\x00garbage",
        b"[1, 2, 3]",
        b'"a string"',
        json.dumps({"id": "e", "object": "event", "event": "job.completed"}).encode(),
        json.dumps({"id": 5, "object": "event", "event": "job.completed", "job_id": "j"}).encode(),
        json.dumps({"id": "e", "object": "job", "event": "job.completed", "job_id": "j"}).encode(),
        json.dumps({"id": "", "object": "event", "event": "job.completed", "job_id": "j"}).encode(),
        json.dumps({"id": "e" * 300, "object": "event", "event": "x", "job_id": "j"}).encode(),
        # Deeper than any parser should follow (the standard library's raised RecursionError).
        b'{"id": "e", "object": "event", "event": "x", "job_id": "j", "x": '
        + b"[" * 1500
        + b"]" * 1500
        + b"}",
        # A lone surrogate cannot be stored as text.
        b'{"id": "e\\ud800", "object": "event", "event": "x", "job_id": "j"}',
        b'{"id": "e", "object": "event", "event": "x", "job_id": "j", "n": NaN}',
    ],
)
async def test_signed_but_malformed(receiver, body):
    await expect_rejected(
        *receiver, body, signed(body, event_id=None), 400, "malformed_payload", "malformed"
    )


CONTROL_CHARACTERS = {
    "nul": "\x00",
    "cr": "\r",
    "lf": "\n",
    "crlf": "\r\n",
    "tab": "\t",
    "unit separator": "\x1f",
    "del": "\x7f",
    "c1 first": "\x80",
    "c1 next line": "\x85",
    "c1 last": "\x9f",
}
BAD_IDS = [
    *(f"evt-{c}-1" for c in CONTROL_CHARACTERS.values()),
    *CONTROL_CHARACTERS.values(),
    "",
    "e" * 256,
]
BAD_ID_NAMES = [
    *(f"{name} inside" for name in CONTROL_CHARACTERS),
    *(f"{name} alone" for name in CONTROL_CHARACTERS),
    "empty",
    "256 characters",
]


async def expect_refused_twice(runtime, client, body):
    """400 malformed_payload, nothing stored, and the same again for the same bytes (a retry of
    a refused event is refused again: never a 503 that the upstream would retry for a day)."""
    for attempt in (1, 2):
        status, answer = await post(client, body, signed(body, event_id=None))
        assert (status, answer["error"]["code"]) == (400, "malformed_payload"), (attempt, answer)
        assert await runtime.store.list() == []
    assert sample(runtime, "receiver_webhook_requests_total", {"outcome": "malformed"}) == 2
    assert sample(runtime, "receiver_webhook_requests_total", {"outcome": "unavailable"}) == 0


@pytest.mark.parametrize("field", ["id", "job_id", "event"])
@pytest.mark.parametrize("value", BAD_IDS, ids=BAD_ID_NAMES)
async def test_ids_and_event_name_with_a_control_character_empty_or_too_long(
    receiver, field, value
):
    body = json.dumps({**json.loads(payload()), field: value}).encode()
    await expect_refused_twice(*receiver, body)


@pytest.mark.parametrize("field", ["id", "job_id"])
async def test_raw_control_characters_are_refused_too(receiver, field):
    # orjson takes U+007F-U+009F unescaped in a string (only C0 must be escaped in JSON).
    body = payload(**{field: "__MARK__"}).replace(b"__MARK__", "evt-\x7f\x85\x9f".encode())
    await expect_refused_twice(*receiver, body)


@pytest.mark.parametrize(
    "value",
    ["e" * 255, "evt-\u00a0-no-break-space", "évènement-✓-\u2028", "01234567-89ab-cdef-0123"],
    ids=["255 characters", "U+00A0", "unicode", "uuid-like"],
)
async def test_ids_just_inside_the_limits_are_stored(receiver, value):
    runtime, client = receiver
    body = payload(value, job_id=value)
    status, answer = await post(client, body, signed(body, event_id=None))
    assert (status, answer["id"], answer["duplicate"]) == (200, value, False)
    status, answer = await post(client, body, signed(body, event_id=None))
    assert (status, answer["duplicate"]) == (200, True)
    record = await runtime.store.get(value)
    assert record is not None and record.job_id == value


async def test_a_value_the_store_refuses_is_400_not_503(aiohttp_client, tmp_path):
    class RefusingStore(MemoryStore):
        async def add_event(self, event):
            raise PayloadError("an event id, name or job id cannot hold NUL")

    runtime = Runtime(settings_for(tmp_path), role="intake", store=RefusingStore())
    async with runtime:
        client = await aiohttp_client(runtime.public_app())
        body = payload()
        status, answer = await post(client, body, signed(body))
    assert (status, answer["error"]["code"]) == (400, "malformed_payload")
    assert sample(runtime, "receiver_webhook_requests_total", {"outcome": "malformed"}) == 1


async def test_event_id_header_mismatch(receiver):
    body = payload()
    headers = {**signed(body), "Service-Event-Id": "evt-other"}
    await expect_rejected(*receiver, body, headers, 400, "malformed_payload", "malformed")


async def test_compressed_body_refused(receiver):
    body = gzip.compress(payload())
    headers = {**signed(body), "Content-Encoding": "gzip"}
    await expect_rejected(*receiver, body, headers, 400, "malformed_payload", "malformed")


async def test_store_failure_answers_503(aiohttp_client, tmp_path):
    class BrokenStore(MemoryStore):
        async def add_event(self, event):
            raise StoreUnavailable("disk I/O error")

    runtime = Runtime(settings_for(tmp_path), role="intake", store=BrokenStore())
    async with runtime:
        client = await aiohttp_client(runtime.public_app())
        body = payload()
        status, answer = await post(client, body, signed(body))
    assert status == 503
    assert answer["error"]["code"] == "unavailable"
    assert sample(runtime, "receiver_webhook_requests_total", {"outcome": "unavailable"}) == 1


async def test_unexpected_error_is_503_not_500(aiohttp_client, tmp_path):
    class ExplodingStore(MemoryStore):
        async def add_event(self, event):
            raise RuntimeError("bug")

    runtime = Runtime(settings_for(tmp_path), role="intake", store=ExplodingStore())
    async with runtime:
        client = await aiohttp_client(runtime.public_app())
        body = payload()
        status, _ = await post(client, body, signed(body))
    assert status == 503


async def test_public_listener_serves_only_the_webhook(receiver):
    """Anything else is refused in the contract's error format: 404 ``not_found`` for another
    path, 405 ``method_not_allowed`` (with ``Allow``) for another method."""
    _, client = receiver
    assert (await client.get("/healthz")).status == 200
    assert (await client.head("/healthz")).status == 200
    for method, path in [("GET", "/metrics"), ("GET", "/admin/events"), ("POST", "/readyz")]:
        response = await client.request(method, path)
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "not_found"
    for method, path, allowed in [
        ("GET", "/webhooks", "POST"),
        ("PUT", "/webhooks", "POST"),
        ("DELETE", "/healthz", "GET, HEAD"),
    ]:
        response = await client.request(method, path)
        assert (response.status, response.headers["Allow"]) == (405, allowed)
        error = (await response.json())["error"]
        assert error["code"] == "method_not_allowed" and method in error["message"]


def test_client_address_believes_only_trusted_proxies():
    class Req:
        def __init__(self, remote, xff):
            self.remote = remote
            self.headers = _Headers(xff)

    class _Headers(dict):
        def __init__(self, xff):
            super().__init__()
            self.xff = xff

        def getall(self, _name, default):
            return [self.xff] if self.xff else default

    address = ClientAddress(["10.0.0.0/8"])
    assert address(Req("203.0.113.9", "1.2.3.4")) == "203.0.113.9"
    assert address(Req("10.0.0.5", "1.2.3.4, 10.0.0.7")) == "1.2.3.4"
    assert address(Req("10.0.0.5", "spoofed, 198.51.100.1")) == "198.51.100.1"
    assert address(Req("10.0.0.5", "")) == "10.0.0.5"
    assert ClientAddress([])(Req("10.0.0.5", "1.2.3.4")) == "10.0.0.5"


async def test_sign_header_format_is_what_the_receiver_verifies(receiver):
    _runtime, client = receiver
    body = payload("evt-raw")
    headers = {
        "Service-Signature": sign(SECRET, body, int(time.time())),
        "Content-Type": "application/json",
    }
    assert (await post(client, body, headers))[0] == 200
