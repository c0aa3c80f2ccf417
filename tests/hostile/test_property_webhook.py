"""Property: a validly signed webhook, whatever JSON its fields hold, is answered 2xx or 4xx.

Hypothesis builds bodies whose ``id``, ``object``, ``event``, ``job_id`` and extra fields hold any
JSON value (strings with control characters, NUL, lone surrogates, unicode, 256+ characters;
numbers, null, booleans, nested arrays and objects; the field missing), signs them with a secret
the receiver knows, and posts each twice to a real receiver app on each inbox backend. For every
body:

- the answer is a 2xx or a 4xx, never a 5xx;
- the second answer is the first one's: an accepted event comes back 2xx with ``duplicate``
  true (and ``duplicate`` on the first answer says whether an earlier example stored that id),
  a refused one is refused again with the same status and error code;
- a refusal stores nothing, an acceptance stores exactly the event, with the bytes as sent, and
  only when its ``id``, ``job_id`` and ``event`` are 1 to 255 characters, none a control one.

The suite runs ``RECEIVER_HYPOTHESIS_EXAMPLES`` examples per backend (default 60, derandomized so
every run tries the same bodies); ``make fuzz-webhook`` runs 2000 random ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.signature import sign
from tests.support.postgres import POSTGRES_URL, fresh_schema, require_postgres

SECRET = "whsec_property_test"
MAX_BODY = 65536
_EXAMPLES_ENV = os.environ.get("RECEIVER_HYPOTHESIS_EXAMPLES")
EXAMPLES = int(_EXAMPLES_ENV or "60")
FIELDS = ("id", "object", "event", "job_id")

# -- bodies -------------------------------------------------------------------------------------

CONTROL = st.characters(min_codepoint=0, max_codepoint=0x1F) | st.characters(
    min_codepoint=0x7F, max_codepoint=0x9F
)
SURROGATE = st.characters(categories=["Cs"])
ODD_STRINGS = st.one_of(
    # Mostly ordinary characters with control characters (C0, DEL, C1) among them.
    st.lists(st.one_of(CONTROL, st.characters(max_codepoint=0x7E)), max_size=12).map("".join),
    st.integers(250, 260).map(lambda n: "e" * n),  # around the 255-character limit
    st.integers(1000, 5000).map(lambda n: "x" * n),
    st.sampled_from(["", " ", "\x00", "\r\n", "\u2028", "null", "event", "é✓😀"]),
)
STRINGS = st.text(max_size=40) | ODD_STRINGS
# Values the parser refuses wherever they are (invalid UTF-8 once unescaped, beyond 64 bits).
UNPARSEABLE = st.one_of(
    st.lists(st.one_of(st.characters(), SURROGATE), min_size=1, max_size=6).map("".join),
    st.sampled_from([2**64, -(2**63) - 1, 10**400]),
)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | STRINGS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(STRINGS, inner, max_size=4),
    max_leaves=8,
)


# True about once in ``n`` draws (integers(0, n - 1) == 0 would come up far more often).
def rarely(n: int) -> st.SearchStrategy[bool]:
    return st.sampled_from([False] * (n - 1) + [True])


MISSING = object()
# A few ids shared by many examples: a later example finds its id stored already.
IDS = st.uuids().map(str) | st.sampled_from(["evt-1", "evt-2", "evt-3"])
USUAL = {
    "id": IDS,
    "object": st.just("event"),
    "event": st.sampled_from(["job.completed", "job.failed", "other.thing"]),
    "job_id": st.uuids().map(str) | st.just("job-1"),
}


def inserted(usual: str) -> st.SearchStrategy[str]:
    """``usual`` with a control character in it (most often NUL, CR or LF)."""
    return st.tuples(st.integers(0, len(usual)), st.sampled_from("\x00\r\n") | CONTROL).map(
        lambda at: usual[: at[0]] + at[1] + usual[at[0] :]
    )


@st.composite
def webhooks(draw: st.DrawFn) -> tuple[bytes, Any]:
    """The body's bytes as signed, and its ``id`` (MISSING when it has none).

    Each field holds its usual value unless drawn among the (usually none, one or two) fields
    that hold the usual value with a control character in it, any string, any JSON value, or
    are missing.
    """
    fields = {key: draw(strategy) for key, strategy in USUAL.items()}
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=3, unique=True)):
        fields[key] = draw(
            st.one_of(
                inserted(draw(USUAL[key])), STRINGS, JSON_VALUES, UNPARSEABLE, st.just(MISSING)
            )
        )
    fields = {k: v for k, v in fields.items() if v is not MISSING}
    extra = draw(st.dictionaries(st.text(max_size=10) | ODD_STRINGS, JSON_VALUES, max_size=3))
    if draw(rarely(10)):
        extra[draw(STRINGS)] = draw(UNPARSEABLE)
    # Extra fields first or last: an extra field of the same name replaces a usual one or not.
    document = {**extra, **fields} if draw(st.booleans()) else {**fields, **extra}
    event_id = document.get("id", MISSING)
    if draw(rarely(30)):
        document["padding"] = "p" * MAX_BODY  # too large: 413
    if draw(rarely(30)):
        document, event_id = draw(JSON_VALUES), MISSING  # not an object at all
    text = json.dumps(document, ensure_ascii=draw(st.booleans()))
    # Lone surrogates unescaped make bytes that are not UTF-8 (refused as such).
    return text.encode("utf-8", "surrogatepass"), event_id


def known(ensure_ascii: bool = True, **fields: Any) -> tuple[bytes, Any]:
    """A webhook for ``@example``: the usual body with ``fields`` replaced."""
    document = {"id": "evt-known", "object": "event", "event": "job.completed", "job_id": "job-1"}
    document.update(fields)
    body = json.dumps(document, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")
    return body, document["id"]


# Tried on every run, whatever Hypothesis draws: the cases the contract names (issue 24).
KNOWN = [
    known(id="evt-known\x00"),  # was 200, then 503 on every retry (SQLite, Postgres)
    known(job_id="job-1\x00"),  # the outcome ledger's key: the same
    known(id="evt-known\r\nX-Injected: 1"),  # was stored, then every http delivery failed
    known(id="evt-\t"),
    known(job_id="job-\x7f"),
    known(ensure_ascii=False, job_id="job-\x85"),
    known(event="job.completed\n"),
    known(id="e" * 256),
    known(id=""),
    known(id="evt-\ud800"),
    known(extra=2**64),
    known(id="evt-\u2028-é-😀"),  # not a control character: stored
]


def with_known_examples(test: Any) -> Any:
    for webhook in reversed(KNOWN):
        test = example(webhook=webhook)(test)
    return test


# -- the receiver -------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def receiver(
    request: pytest.FixtureRequest, tmp_path: Path, aiohttp_client: Any
) -> AsyncIterator[tuple[Runtime, Any]]:
    backend: str = request.param
    store: dict[str, str] = {"url": "memory://"}
    async with contextlib.AsyncExitStack() as stack:
        if backend == "sqlite":
            store = {"url": f"sqlite:///{tmp_path}/inbox.db"}
        elif backend == "postgres":
            require_postgres()
            store = {"url": POSTGRES_URL, "schema": await stack.enter_async_context(fresh_schema())}
        config = {
            "webhook": {"secrets": [SECRET]},
            "server": {"max_body_bytes": MAX_BODY},
            "store": store,
            "sinks": [{"name": "files", "type": "download", "directory": str(tmp_path / "dl")}],
        }
        runtime = Runtime(parse_settings(config, env={}), role="intake")
        await stack.enter_async_context(runtime)
        yield runtime, await aiohttp_client(runtime.public_app())


def contract_id(value: str) -> bool:
    """The contract's rule for an accepted ``id``, ``job_id`` (and, here, ``event``): 1 to 255
    characters, none of them a control character (C0, DEL, C1)."""
    return 0 < len(value) <= 255 and not any(c < " " or "\x7f" <= c <= "\x9f" for c in value)


def can_look_up(value: Any) -> bool:
    """Whether ``value`` can be an id to look up in every store (Postgres text holds no NUL)."""
    if not isinstance(value, str) or "\x00" in value:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


async def stored_count(runtime: Runtime) -> int:
    counts, _oldest = await runtime.store.counts()
    return sum(counts.values())


async def post(client: Any, body: bytes, event_id: Any) -> tuple[int, dict[str, Any]]:
    headers = {
        "Content-Type": "application/json",
        "Service-Signature": sign(SECRET, body, int(time.time())),
    }
    if isinstance(event_id, str) and event_id.isascii() and event_id.isprintable():
        headers["Service-Event-Id"] = event_id
    response = await client.post("/webhooks", data=body, headers=headers)
    return response.status, await response.json()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=_EXAMPLES_ENV is None,  # the suite's run: the same examples every time
    database=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # one receiver for all examples, on purpose
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
@with_known_examples
@given(webhook=webhooks())
async def test_a_signed_body_is_answered_2xx_or_4xx_the_same_way_twice(
    receiver: tuple[Runtime, Any], webhook: tuple[bytes, Any]
) -> None:
    runtime, client = receiver
    body, event_id = webhook
    before = await stored_count(runtime)
    was_stored = can_look_up(event_id) and await runtime.store.get(event_id) is not None

    status, answer = await post(client, body, event_id)
    assert 200 <= status < 300 or 400 <= status < 500, (status, answer)
    event(f"answered {status}")  # shown by --hypothesis-show-statistics
    after = await stored_count(runtime)
    if status < 300:
        assert answer == {"received": True, "id": event_id, "duplicate": was_stored}
        assert after == before + (0 if was_stored else 1)
        record = await runtime.store.get(event_id)
        assert record is not None
        if not was_stored:
            assert record.body == body
            for value in (record.id, record.event, record.job_id):
                assert contract_id(value), f"accepted {value!r}"
    else:
        assert set(answer) == {"error"} and answer["error"]["message"], answer
        assert after == before, "a refused body stored something"

    again, second = await post(client, body, event_id)
    if status < 300:
        assert (again, second) == (status, {"received": True, "id": event_id, "duplicate": True})
    else:
        assert (again, second["error"]["code"]) == (status, answer["error"]["code"]), second
    assert await stored_count(runtime) == after
