"""The inbox page over HTTP, on the real ops listener app: sign-in, sessions, CSRF, bad input.

The browser tests (tests/web) drive the same pages in Chromium; these check every refusal and
header quickly, without a browser.
"""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.store import NewEvent, Outcome
from receiver.store.memory import MemoryStore
from receiver.web.render import CONTENT_SECURITY_POLICY

TOKEN = "admin-token-for-the-inbox-page"
XSS = "<script>alert(1)</script>"
SIGNED_URL = "https://cdn.test/a.png?signature=SECRETSIG"


def settings_for(tmp_path, *, token=TOKEN, host="127.0.0.1", store=None):
    return parse_settings(
        {
            "webhook": {"secrets": ["whsec_ui"]},
            "store": {"url": store or f"sqlite:///{tmp_path}/inbox-{uuid.uuid4().hex[:6]}.db"},
            "admin": {"token": token, "host": host},
            "sinks": [
                {"name": "files", "type": "download", "directory": str(tmp_path / "dl")},
                {"name": "hook", "type": "http", "url": "http://127.0.0.1:9/in", "secret": "x"},
            ],
        },
        env={},
    )


def new_event(event_id, *, received_at, name="job.completed", item_name="wave"):
    body = {
        "id": event_id,
        "object": "event",
        "event": name,
        "job_id": f"job-{event_id}",
        "data": {"item_name": item_name, "file_url": SIGNED_URL},
    }
    return NewEvent(
        id=event_id,
        event=name,
        job_id=f"job-{event_id}",
        body=json.dumps(body).encode(),
        headers={"Service-Event-Id": event_id},
        received_at=received_at,
        sinks=("files", "hook"),
    )


@pytest.fixture
async def ops(aiohttp_client, tmp_path):
    """``await ops(**settings)`` -> (runtime, client of its ops app); intake role: no workers."""
    runtimes = []

    async def start(store=None, **options):
        runtime = Runtime(settings_for(tmp_path, **options), role="intake", store=store)
        await runtime.__aenter__()
        runtimes.append(runtime)
        return runtime, await aiohttp_client(runtime.ops_app())

    yield start
    for runtime in runtimes:
        await runtime.close()


async def sign_in(client, token=TOKEN):
    response = await client.post("/ui/login", data={"token": token}, allow_redirects=False)
    assert response.status == 303, await response.text()
    return response


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, html
    return match.group(1)


def set_cookie(client, value: str) -> None:
    jar = client.session.cookie_jar
    jar.clear()
    jar.update_cookies({"receiver_ui_session": value}, client.make_url("/ui/"))


def event_ids(html: str) -> list[str]:
    return re.findall(r'href="/ui/events/(ev-[\w-]+)"', html)


async def page(client, path, status=200):
    response = await client.get(path, allow_redirects=False)
    text = await response.text()
    assert response.status == status, text
    return text


async def test_sign_in_with_the_token_sets_a_strict_http_only_session(ops):
    _runtime, client = await ops()
    response = await client.get("/ui/", allow_redirects=False)
    assert response.status == 303
    assert response.headers["Location"] == "/ui/login?next=/ui/"
    form = await page(client, "/ui/login")
    assert 'action="/ui/login"' in form and 'name="token"' in form

    wrong = await client.post("/ui/login", data={"token": "not-it"}, allow_redirects=False)
    assert wrong.status == 401
    assert "That is not the admin token" in await wrong.text()
    assert "receiver_ui_session" not in wrong.headers.get("Set-Cookie", "")
    assert (await client.get("/ui/", allow_redirects=False)).status == 303

    response = await client.post(
        "/ui/login", data={"token": TOKEN, "next": "/ui/dead"}, allow_redirects=False
    )
    assert response.status == 303 and response.headers["Location"] == "/ui/dead"
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui/" in cookie
    assert "Secure" not in cookie  # plain HTTP here; behind a TLS proxy it is set
    assert "Overview" in await page(client, "/ui/")
    # The admin API still takes the Bearer token, and only it.
    assert (await client.get("/admin/events")).status == 401
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert (await client.get("/admin/events", headers=headers)).status == 200


async def test_sign_in_goes_only_to_pages_of_this_ui(ops):
    _runtime, client = await ops()
    for target in ["https://evil.test/", "//evil.test/ui/", "/metrics", "/ui/\\evil"]:
        response = await client.post(
            "/ui/login", data={"token": TOKEN, "next": target}, allow_redirects=False
        )
        assert response.headers["Location"] == "/ui/", target


async def test_over_https_the_cookie_is_secure(ops):
    _runtime, client = await ops()
    response = await client.post(
        "/ui/login",
        data={"token": TOKEN},
        headers={"X-Forwarded-Proto": "https"},
        allow_redirects=False,
    )
    assert "Secure" in response.headers["Set-Cookie"]


async def test_an_altered_or_foreign_cookie_is_no_session(ops):
    _runtime, client = await ops()
    await sign_in(client)
    value = client.session.cookie_jar.filter_cookies(client.make_url("/ui/"))[
        "receiver_ui_session"
    ].value
    session_id, expires, mac = value.split(".")
    for forged in [
        f"{session_id}.{int(expires) + 999}.{mac}",  # longer life, same signature
        f"x{session_id}.{expires}.{mac}",
        f"{session_id}.{expires}.{'0' * len(mac)}",
        "garbage",
    ]:
        set_cookie(client, forged)
        response = await client.get("/ui/", allow_redirects=False)
        assert response.status == 303, forged
    # A second receiver (another signing key) does not take the first one's cookie either.
    _other_runtime, other = await ops()
    set_cookie(other, value)
    assert (await other.get("/ui/", allow_redirects=False)).status == 303


async def test_changes_need_a_post_with_the_sessions_csrf_token(ops):
    runtime, client = await ops()
    now = time.time()
    await runtime.store.add_event(new_event("ev-1", received_at=now))
    await runtime.store.settle("ev-1", "files", Outcome("dead", "HTTP 500"), now=now)
    await sign_in(client)
    html = await page(client, "/ui/events/ev-1")
    token = csrf_of(html)

    async def files_state():
        record = await runtime.store.get("ev-1")
        return {d.sink: d.state for d in record.deliveries}["files"]

    # A GET on the action's address changes nothing.
    assert "only takes the form" in await page(client, "/ui/events/ev-1/redeliver", 405)
    await page(client, "/ui/dead/redeliver", 405)
    assert await files_state() == "dead"
    # POSTs without the token, with another one, or from another origin are refused.
    for data, headers in [
        ({"sink": "files"}, {}),
        ({"sink": "files", "csrf": "0" * 64}, {}),
        ({"sink": "files", "csrf": token}, {"Origin": "https://evil.test"}),
    ]:
        response = await client.post("/ui/events/ev-1/redeliver", data=data, headers=headers)
        assert response.status == 403
        assert "CSRF" in await response.text()
    response = await client.post("/ui/dead/redeliver", data={})
    assert response.status == 403
    assert await files_state() == "dead"
    # With the token, from this page: done, and the page says so.
    response = await client.post(
        "/ui/events/ev-1/redeliver", data={"sink": "files", "csrf": token}, allow_redirects=False
    )
    assert response.status == 303
    assert response.headers["Location"] == "/ui/events/ev-1?redelivered=1"
    assert await files_state() == "pending"
    assert "1 delivery queued again" in await page(client, "/ui/events/ev-1?redelivered=1")
    # Signed out, even the right token no longer works.
    await client.post("/ui/logout", data={"csrf": token})
    response = await client.post("/ui/dead/redeliver", data={"csrf": token})
    assert response.status == 401


async def test_unknown_ids_and_addresses_get_404_pages(ops):
    _runtime, client = await ops()
    await sign_in(client)
    assert "No event with that id" in await page(client, "/ui/events/no-such-event", 404)
    assert "No page at this address" in await page(client, "/ui/no/such/page", 404)
    token = csrf_of(await page(client, "/ui/"))
    response = await client.post("/ui/events/no-such-event/redeliver", data={"csrf": token})
    assert response.status == 404
    response = await client.post("/ui/nowhere", data={"csrf": token})
    assert response.status == 404
    assert "Bad filter" in await page(client, "/ui/events?state=exploded", 400)
    assert "choose a sink too" in await page(client, "/ui/events?state=skipped", 400)
    assert "not a page cursor" in await page(client, "/ui/events?before=%%%", 400)
    assert "since" in await page(client, "/ui/events?since=yesterday", 400)
    assert (await client.get("/ui", allow_redirects=False)).headers["Location"] == "/ui/"


async def test_payload_strings_are_text_and_signed_urls_stay_hidden(ops):
    runtime, client = await ops()
    now = time.time()
    await runtime.store.add_event(new_event("ev-x", received_at=now, item_name=XSS))
    await runtime.store.settle("ev-x", "hook", Outcome("dead", f"GET {SIGNED_URL}: 403"), now=now)
    await sign_in(client)
    for path in ["/ui/events/ev-x", "/ui/events", "/ui/", "/ui/dead"]:
        html = await page(client, path)
        assert XSS not in html, path
        assert "SECRETSIG" not in html, path
    detail = await page(client, "/ui/events/ev-x")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in detail
    assert "https://cdn.test/a.png?&lt;redacted&gt;" in detail


async def test_every_answer_carries_the_security_headers(ops):
    _runtime, client = await ops()
    for path in ["/ui/login", "/ui/", "/ui/static/ui.css", "/ui/nope"]:
        response = await client.get(path, allow_redirects=False)
        assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY, path
        assert response.headers["X-Frame-Options"] == "DENY"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
    html = await page(client, "/ui/login")
    assert "<script>" not in html  # no inline script: only ui.js, from this origin


async def test_without_a_token_the_page_is_served_only_on_loopback(ops, tmp_path):
    _runtime, exposed = await ops(token="", host="0.0.0.0")
    text = await page(exposed, "/ui/", 403)
    assert "admin.token is not set" in text and "0.0.0.0" in text
    await page(exposed, "/ui/login", 403)
    assert (await exposed.post("/ui/dead/redeliver", data={})).status == 403

    runtime, client = await ops(token="", host="127.0.0.1")
    await runtime.store.add_event(new_event("ev-1", received_at=time.time()))
    html = await page(client, "/ui/")
    assert "No admin token is set" in html
    assert "Sign out" not in html
    cookie = client.session.cookie_jar.filter_cookies(client.make_url("/ui/"))
    assert "receiver_ui_session" in cookie  # so that forms carry a CSRF token
    token = csrf_of(await page(client, "/ui/events/ev-1"))
    assert (await client.post("/ui/events/ev-1/redeliver", data={})).status == 403
    response = await client.post(
        "/ui/events/ev-1/redeliver", data={"csrf": token}, allow_redirects=False
    )
    assert response.status == 303
    assert (await client.get("/ui/login", allow_redirects=False)).status == 303
    # Another site's name pointed at 127.0.0.1 (DNS rebinding) gets nothing.
    rebound = await client.get("/ui/", headers={"Host": f"evil.test:{client.port}"})
    assert rebound.status == 403
    assert "answers only to this machine" in await rebound.text()
    assert (await client.get("/ui/", headers={"Host": f"localhost:{client.port}"})).status == 200


async def test_events_page_filters(ops):
    runtime, client = await ops()
    t0 = time.time() - 1000
    for i in range(8):
        name = "job.failed" if i % 4 == 0 else "job.completed"
        await runtime.store.add_event(new_event(f"ev-{i}", received_at=t0 + i, name=name))
    await runtime.store.settle("ev-6", "hook", Outcome("dead", "HTTP 500"), now=t0 + 10)
    await runtime.store.settle("ev-6", "files", Outcome("done"), now=t0 + 10)
    await runtime.store.settle("ev-5", "hook", Outcome("dead", "HTTP 500"), now=t0 + 10)
    await sign_in(client)

    assert event_ids(await page(client, "/ui/events")) == [f"ev-{i}" for i in range(7, -1, -1)]
    assert event_ids(await page(client, "/ui/events?event=job.failed")) == ["ev-4", "ev-0"]
    assert event_ids(await page(client, "/ui/events?sink=hook&state=dead")) == ["ev-6", "ev-5"]
    assert event_ids(await page(client, "/ui/events?sink=files&state=done")) == ["ev-6"]
    assert event_ids(await page(client, "/ui/events?state=dead")) == ["ev-6"]
    assert event_ids(await page(client, "/ui/events?q=job-ev-3")) == ["ev-3"]
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0 + 2))
    until = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0 + 5))
    window = await page(client, f"/ui/events?since={since}&until={until}")
    assert event_ids(window) == ["ev-4", "ev-3", "ev-2"]


async def test_events_pages_older_and_newer_keep_the_filter(ops):
    store = MemoryStore()
    _runtime, client = await ops(store=store)
    t0 = time.time() - 1000
    for i in range(130):
        name = "job.failed" if i % 2 else "job.completed"
        await store.add_event(new_event(f"ev-{i:03d}", received_at=t0 + i, name=name))
    await sign_in(client)

    seen, path = [], "/ui/events?event=job.completed"
    pages = []
    while path:
        html = await page(client, path)
        pages.append(path)
        seen += event_ids(html)
        older = re.search(r'href="(/ui/events\?[^"]*before=[^"]+)">Older', html)
        path = older.group(1).replace("&amp;", "&") if older else None
    assert seen == [f"ev-{i:03d}" for i in range(128, -1, -2)]
    assert len(pages) == 2  # 65 events, 50 a page
    newer = re.search(r'href="(/ui/events\?[^"]*after=[^"]+)">\u2039 Newer', html)
    assert newer and "event=job.completed" in newer.group(1)
    back = await page(client, newer.group(1).replace("&amp;", "&"))
    assert event_ids(back) == seen[:50]
    assert "Newer" not in back  # the first page again


async def test_a_store_that_does_not_answer_gets_a_503_page(ops):
    store = MemoryStore()
    _runtime, client = await ops(store=store)
    await sign_in(client)
    store.unavailable = "disk on fire"
    for path in ["/ui/", "/ui/events", "/ui/events/x", "/ui/dead"]:
        assert "disk on fire" in await page(client, path, 503)
