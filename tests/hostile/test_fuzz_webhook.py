"""Fuzzing the webhook endpoint of a real ``receiver serve --role intake`` over raw sockets.

Hypothesis builds hostile requests (bodies truncated, huge, not UTF-8, not JSON, JSON of the
wrong shape; signatures missing, wrong, stale, garbled or duplicated; lying, duplicated or absent
``Content-Length``; chunked bodies, valid and broken; compressed bodies; junk headers) and sends
each exactly as built. For every request: no 5xx, every refusal in the contract's error format
(``{"error": {"code", "message"}}`` with one of its codes), the event stored if and only if the
answer was 2xx, and the process still alive.

The suite runs ``RECEIVER_FUZZ_EXAMPLES`` examples (default 200); ``make fuzz`` runs 100,000.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from receiver.signature import sign
from tests.support.helpers import ReceiverProcess
from tests.support.hostile import SECRET, intake_config, running

EXAMPLES = int(os.environ.get("RECEIVER_FUZZ_EXAMPLES", "200"))
MAX_BODY = 65536  # server.max_body_bytes in tests/hostile/conftest.py
READ_TIMEOUT = 0.1
TOKEN = st.text(
    alphabet=st.sampled_from(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-.^_`|~"
    ),
    min_size=1,
    max_size=20,
)
# Any printable character but the colon: mostly not a valid header name (aiohttp's parser).
BAD_TOKEN = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=":"),
    min_size=1,
    max_size=20,
)
HEADER_VALUE = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=0, max_size=60
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)

outcomes: Counter[str] = Counter()
# The contract's error codes of the public listener.
ERROR_CODES = frozenset(
    {
        "missing_signature",
        "invalid_signature",
        "stale_timestamp",
        "payload_too_large",
        "malformed_payload",
        "unavailable",
    }
)
CONTENT_LENGTH = re.compile(rb"(?im)^content-length:\s*(\d+)\s*$")


@dataclass
class Hostile:
    """One request as built: its parts, and how each is mangled."""

    event_id: str
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)
    framing: str = "content-length"
    raw_tail: bytes = b""

    def to_bytes(self, port: int) -> bytes:
        lines = ["POST /webhooks HTTP/1.1", f"Host: 127.0.0.1:{port}"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        body = self.body
        if self.framing == "content-length":
            lines.append(f"Content-Length: {len(body)}")
        elif self.framing.startswith("content-length"):
            lines.append(f"Content-Length: {self.framing.split(' ', 1)[1]}")
        elif self.framing.startswith("chunked"):
            lines.append("Transfer-Encoding: chunked")
            body = _chunked(body, broken=self.framing == "chunked broken")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body + self.raw_tail


def _chunked(body: bytes, *, broken: bool) -> bytes:
    pieces = [body[i : i + 97] for i in range(0, len(body), 97)]
    out = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    if broken:
        return out[: len(out) // 2] + b"zz\r\n"
    return out + b"0\r\n\r\n"


@st.composite
def bodies(draw: st.DrawFn, event_id: str) -> bytes:
    valid = {
        "id": event_id,
        "object": "event",
        "event": draw(st.sampled_from(["job.completed", "job.failed", "other.thing"])),
        "job_id": f"job-{event_id}",
        "asset_ids": {"image": "a-1"},
    }
    kind = draw(
        st.sampled_from(
            [
                "valid",
                "valid",
                "valid",
                "wrong types",
                "missing field",
                "not an object",
                "truncated",
                "huge",
                "not utf-8",
                "utf-16",
                "binary",
                "empty",
            ]
        )
    )
    if kind == "valid":
        return json.dumps(valid).encode()
    if kind == "wrong types":
        key = draw(st.sampled_from(["id", "object", "event", "job_id"]))
        # A string is a right type; for "id" it would also make another (maybe repeated) id.
        value = draw(JSON_VALUES.filter(lambda v: not isinstance(v, str)))
        return json.dumps({**valid, key: value}).encode()
    if kind == "missing field":
        key = draw(st.sampled_from(["id", "object", "event", "job_id"]))
        return json.dumps({k: v for k, v in valid.items() if k != key}).encode()
    if kind == "not an object":
        return json.dumps(draw(JSON_VALUES)).encode()
    if kind == "truncated":
        text = json.dumps(valid).encode()
        return text[: draw(st.integers(0, len(text) - 1))]
    if kind == "huge":
        padding = "x" * draw(st.integers(MAX_BODY, 3 * MAX_BODY))
        return json.dumps({**valid, "padding": padding}).encode()
    if kind == "not utf-8":
        text = json.dumps({**valid, "note": "caf\u00e9"}, ensure_ascii=False)
        return text.encode("latin-1")
    if kind == "utf-16":
        return json.dumps(valid).encode("utf-16")
    if kind == "binary":
        return draw(st.binary(max_size=300))
    return b""


@st.composite
def hostile_requests(draw: st.DrawFn) -> Hostile:
    event_id = f"evt-{uuid.uuid4()}"  # fresh every example: "stored" must mean this request
    body = draw(bodies(event_id))
    request = Hostile(event_id=event_id, body=body)
    now = int(time.time())

    signature = draw(
        st.sampled_from(
            ["good", "good", "good", "wrong secret", "stale", "garbled", "missing", "two", "legacy"]
        )
    )
    if signature == "good":
        request.headers.append(("Service-Signature", sign(SECRET, body, now)))
    elif signature == "wrong secret":
        request.headers.append(("Service-Signature", sign("whsec_wrong", body, now)))
    elif signature == "stale":
        request.headers.append(("Service-Signature", sign(SECRET, body, now - 3600)))
    elif signature == "garbled":
        request.headers.append(("Service-Signature", draw(HEADER_VALUE)))
    elif signature == "two":
        first, second = sign(SECRET, body, now), sign("whsec_wrong", body, now)
        if draw(st.booleans()):
            first, second = second, first
        request.headers += [("Service-Signature", first), ("Service-Signature", second)]
    elif signature == "legacy":
        request.headers.append(("X-Service-Signature", "sha256=" + "0" * 64))

    event_header = draw(st.sampled_from(["match", "match", "mismatch", "missing", "twice"]))
    if event_header == "match":
        request.headers.append(("Service-Event-Id", event_id))
    elif event_header == "mismatch":
        request.headers.append(("Service-Event-Id", f"evt-{uuid.uuid4()}"))
    elif event_header == "twice":
        request.headers += [("Service-Event-Id", event_id), ("Service-Event-Id", event_id)]

    # Weighted: the framings that leave the receiver waiting for a body (declared longer than
    # sent, or cut inside a chunk) each cost a read timeout, so they are a small share.
    roll = draw(st.integers(0, 99))
    request.framing = (
        "content-length"
        if roll < 50
        else "chunked"
        if roll < 70
        else "none"
        if roll < 75
        else f"content-length {max(0, len(body) - draw(st.integers(1, 50)))}"
        if roll < 82
        else "content-length -1"
        if roll < 85
        else "content-length 12abc"
        if roll < 88
        else f"content-length {len(body)}\r\nContent-Length: {len(body) + 1}"
        if roll < 92
        else f"content-length {len(body) + draw(st.integers(1, 50))}"
        if roll < 96
        else "chunked broken"
    )
    encoding = draw(st.sampled_from([None] * 6 + ["gzip", "identity", "br, gzip"]))
    if encoding is not None:
        request.headers.append(("Content-Encoding", encoding))
    if draw(st.booleans()):
        request.headers.append(("Content-Type", draw(HEADER_VALUE)))
    request.headers += draw(st.lists(st.tuples(TOKEN, HEADER_VALUE), max_size=3))
    if draw(st.integers(0, 19)) == 0:
        request.headers.append((draw(BAD_TOKEN), draw(HEADER_VALUE)))
    if draw(st.integers(0, 9)) == 0:
        request.raw_tail = draw(st.binary(max_size=100))  # pipelined junk after the request
    return request


def exchange(port: int, data: bytes) -> tuple[int | None, bytes]:
    """Send ``data``; the first answer's status (None: closed with no answer) and, when it is
    not a 2xx, its body (as far as it came).

    The client never half-closes: aiohttp closes a connection at EOF, before answering.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # The receiver may refuse early (a size over the limit): its answer still counts.
        with contextlib.suppress(OSError):
            sock.sendall(data)
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while b"\r\n\r\n" not in received:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                received += chunk
            status = _status(received)
            if status is not None and not 200 <= status < 300:
                head, _, body = received.partition(b"\r\n\r\n")
                length = CONTENT_LENGTH.search(head)
                size = int(length.group(1)) if length is not None else None
                while size is not None and len(body) < size:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    body += chunk
                return status, body[:size]  # not the answers to what was pipelined after it
    return _status(received), b""


def _status(received: bytes) -> int | None:
    if not received.startswith(b"HTTP/1."):
        return None
    return int(received.split(b" ", 2)[1])


@pytest.fixture(scope="module")
def fuzz_intake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReceiverProcess]:
    """An intake process with a short read timeout: a body that never completes costs 0.1 s."""
    config = intake_config(tmp_path_factory.mktemp("fuzz"), read_timeout_seconds=READ_TIMEOUT)
    with running(ReceiverProcess(config, role="intake")) as proc:
        yield proc


@pytest.fixture(scope="module")
def inbox(fuzz_intake: ReceiverProcess, request: pytest.FixtureRequest) -> Iterator[Any]:
    db = fuzz_intake.cwd / "inbox.db"
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as conn:
        yield conn
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and outcomes:
        summary = ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items()))
        reporter.write_line(f"\nfuzz: {sum(outcomes.values())} requests ({summary})")


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(hostile=hostile_requests())
def test_no_hostile_request_gets_a_5xx_or_stores_a_refused_event(
    hostile: Hostile, fuzz_intake: ReceiverProcess, inbox: Any
) -> None:
    port = fuzz_intake.public_port
    status, body = exchange(port, hostile.to_bytes(port))
    outcomes[str(status) if status is not None else "no answer"] += 1
    assert status is None or status < 500, status
    if status is not None and status >= 400:  # the contract's error body, whatever refused it
        error = json.loads(body)["error"]
        assert error["code"] in ERROR_CODES and isinstance(error["message"], str), (status, body)
    stored = inbox.execute("SELECT 1 FROM events WHERE id = ?", (hostile.event_id,)).fetchall()
    accepted = status is not None and 200 <= status < 300
    assert bool(stored) == accepted, (status, hostile)
    assert fuzz_intake.proc is not None and fuzz_intake.proc.poll() is None, "it died"
