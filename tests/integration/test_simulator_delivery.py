"""The simulator's webhook sender against real HTTP targets: signatures, retries, disabling."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from receiver.signature import verify
from receiver.simulator import DEFAULT_API_KEY, KINDS, Simulator
from receiver.simulator.delivery import (
    DISABLE_AFTER_FAILURES,
    RETRY_SCHEDULE_SECONDS,
    DeliveryFaults,
    classify,
    latency_stats,
    retry_delays,
)
from receiver.simulator.sender import WebhookSender
from tests.support.helpers import free_port, wait_for

SECRET = "whsec_simulated"
NOW = 1_800_000_000.0
AUTH = {"Authorization": f"Bearer {DEFAULT_API_KEY}"}


@dataclass
class Target:
    """A webhook receiver stand-in that records every request and answers as told."""

    url: str = ""
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)  # answered in turn; then ``default``
    default: int = 200
    delay: float = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append((dict(request.headers), body))
        if self.delay:
            await asyncio.sleep(self.delay)
        status = self.statuses.pop(0) if self.statuses else self.default
        return web.Response(status=status, text="{}")

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.requests]


@pytest.fixture
async def target(aiohttp_server) -> Target:
    target = Target()
    app = web.Application()
    app.router.add_post("/hook", target.handle)
    server = await aiohttp_server(app)
    target.url = str(server.make_url("/hook"))
    return target


@pytest.fixture
async def sender():
    senders: list[WebhookSender] = []

    async def make(sim: Simulator, **kwargs: Any) -> WebhookSender:
        sender = WebhookSender(sim, **kwargs)
        await sender.start()
        senders.append(sender)
        return sender

    yield make
    for s in senders:
        await s.close()


# ------------------------------------------------------------------ signatures


async def test_signatures_verify_with_the_receivers_code_and_an_independent_hmac(
    target: Target, sender
) -> None:
    sim = Simulator(seed=1, shape="full")
    sim.add_webhook(target.url, secret=SECRET)
    s = await sender(sim, wall_clock=lambda: NOW)
    payloads = [sim.add_job(kind) for kind in KINDS] + [sim.add_failed_job("animation")]
    for payload in payloads:
        s.publish(payload)
    await s.wait_settled()

    assert len(target.requests) == len(payloads)
    for headers, body in target.requests:
        payload = json.loads(body)
        # The receiver's own verification.
        verified = verify(
            secrets=["whsec_other", SECRET],
            body=body,
            header=headers["Service-Signature"],
            now=NOW,
            tolerance_seconds=300,
        )
        assert verified.secret_index == 1
        # An independent HMAC, written from the spec.
        t, v1 = (part.split("=", 1)[1] for part in headers["Service-Signature"].split(","))
        assert t == headers["X-Service-Timestamp"] == str(int(NOW))
        expected = hmac.new(SECRET.encode(), f"{t}.".encode() + body, hashlib.sha256)
        assert hmac.compare_digest(v1, expected.hexdigest())
        legacy = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert headers["X-Service-Signature"] == f"sha256={legacy}"
        assert headers["Service-Event-Id"] == payload["id"]
        assert headers["X-Service-Event"] == payload["event"]
        assert headers["Content-Type"] == "application/json"
        assert payload["object"] == "event"
    assert {p["id"] for p in target.bodies()} == {p["id"] for p in payloads}
    assert {p["event"] for p in target.bodies()} == {"job.completed", "job.failed"}


async def test_each_subscription_gets_its_events_signed_with_its_own_secret(
    target: Target, sender
) -> None:
    sim = Simulator(seed=2, shape="full")
    everything = sim.add_webhook(target.url, secret="whsec_a")
    failures = sim.add_webhook(target.url, ["job.failed"], secret="whsec_b")
    s = await sender(sim)
    s.publish(sim.add_job("image"))
    s.publish(sim.add_failed_job("logo"))
    await s.wait_settled()

    by_secret: dict[str, list[str]] = {"whsec_a": [], "whsec_b": []}
    for headers, body in target.requests:
        for secret in by_secret:
            try:
                verify(
                    secrets=[secret],
                    body=body,
                    header=headers["Service-Signature"],
                    now=float(headers["X-Service-Timestamp"]),
                    tolerance_seconds=300,
                )
            except Exception:
                continue
            by_secret[secret].append(json.loads(body)["event"])
    assert sorted(by_secret["whsec_a"]) == ["job.completed", "job.failed"]
    assert by_secret["whsec_b"] == ["job.failed"]
    assert {d.webhook_id for d in s.deliveries} == {everything.id, failures.id}


async def test_clock_skew_moves_the_signature_timestamp(target: Target, sender) -> None:
    sim = Simulator(seed=3, shape="full")
    sim.add_webhook(target.url, secret=SECRET)
    s = await sender(sim, wall_clock=lambda: NOW, faults=DeliveryFaults(clock_skew_seconds=-400))
    s.publish(sim.add_job("logo"))
    await asyncio.wait_for(wait_for_requests(target, 1), 10)
    headers, body = target.requests[0]
    assert headers["X-Service-Timestamp"] == str(int(NOW) - 400)
    with pytest.raises(Exception, match="from the receiver's clock"):
        verify(
            secrets=[SECRET],
            body=body,
            header=headers["Service-Signature"],
            now=NOW,
            tolerance_seconds=300,
        )


async def wait_for_requests(target: Target, count: int) -> None:
    async def enough() -> bool:
        return len(target.requests) >= count

    await wait_for(enough, what=f"{count} requests")


# ------------------------------------------------------------------ retries


def test_the_schedule_is_the_specs_and_scales() -> None:
    assert RETRY_SCHEDULE_SECONDS == (60, 300, 1800, 7200, 21600, 43200)
    assert retry_delays() == RETRY_SCHEDULE_SECONDS
    # "the last retry is about 21 hours after the event"
    assert 20 * 3600 < sum(retry_delays()) < 21 * 3600
    assert retry_delays(0.001) == pytest.approx((0.06, 0.3, 1.8, 7.2, 21.6, 43.2))
    with pytest.raises(ValueError):
        WebhookSender(Simulator(shape="full"), time_scale=0)


def test_classify_and_latency_stats() -> None:
    assert [classify(s) for s in (200, 204, 301, 401, 429, 500, 503, 99, 999)] == [
        "2xx", "2xx", "3xx", "4xx", "4xx", "5xx", "5xx", "1xx", "5xx",
    ]  # fmt: skip
    stats = latency_stats([0.3, 0.1, 0.2, 0.4])
    assert stats is not None
    assert (stats["min"], stats["p50"], stats["max"], stats["count"]) == (0.1, 0.2, 0.4, 4)
    assert latency_stats([]) is None


async def test_failed_attempts_follow_the_time_scaled_schedule(target: Target, sender) -> None:
    sim = Simulator(seed=4, shape="full")
    hook = sim.add_webhook(target.url, secret=SECRET)
    target.statuses = [500, 503, 404, 401, 502, 500]  # six failures, then 200
    scale = 0.00001
    s = await sender(sim, time_scale=scale)
    (delivery,) = s.publish(sim.add_job("image"))
    await s.wait_settled()

    assert delivery.state == "delivered"
    assert [a.outcome for a in delivery.attempts] == [
        "5xx",
        "5xx",
        "4xx",
        "4xx",
        "5xx",
        "5xx",
        "2xx",
    ]
    assert len(target.requests) == 7
    delays = retry_delays(scale)
    pairs = zip(delivery.attempts[:-1], delivery.attempts[1:], delays, strict=True)
    for before, after, wait in pairs:
        assert after.due - before.finished == pytest.approx(wait, abs=1e-9)
        assert after.started >= after.due
    # Same event, same bytes on every attempt; a fresh signature each time.
    assert len({body for _, body in target.requests}) == 1
    assert hook.consecutive_failures == 0  # the 2xx reset it


async def test_seven_failed_attempts_give_up(target: Target, sender) -> None:
    sim = Simulator(seed=5, shape="full")
    hook = sim.add_webhook(target.url, secret=SECRET)
    target.default = 500
    s = await sender(sim, time_scale=0.00001)
    (delivery,) = s.publish(sim.add_job("scene"))
    await s.wait_settled()

    assert delivery.state == "exhausted"
    assert len(delivery.attempts) == len(target.requests) == 1 + len(RETRY_SCHEDULE_SECONDS)
    assert hook.consecutive_failures == 7 and hook.active
    summary = s.summary()
    assert summary.states["exhausted"] == 1
    assert summary.outcomes["5xx"] == 7 and summary.attempts == 7
    assert summary.latencies == ()


async def test_a_timeout_and_a_network_error_are_failed_attempts(target: Target, sender) -> None:
    sim = Simulator(seed=6, shape="full")
    slow = sim.add_webhook(target.url, secret=SECRET)
    closed = sim.add_webhook(f"http://127.0.0.1:{free_port()}/hook", secret=SECRET)
    target.delay = 1.0
    s = await sender(sim, time_scale=1.0, attempt_timeout=0.1)
    deliveries = s.publish(sim.add_job("logo"))
    by_hook = {d.webhook_id: d for d in deliveries}

    async def both_failed_once() -> bool:
        return all(d.attempts and d.attempts[0].finished for d in deliveries)

    await wait_for(both_failed_once, what="first attempts")
    assert by_hook[slow.id].attempts[0].outcome == "timeout"
    assert by_hook[closed.id].attempts[0].outcome == "error"
    assert slow.consecutive_failures == closed.consecutive_failures == 1
    assert all(d.state == "scheduled" for d in deliveries)  # the next try is a minute away
    await s.close()
    assert all(d.state == "stopped" for d in deliveries)
    assert s.summary().outcomes["timeout"] == s.summary().outcomes["error"] == 1


async def test_a_success_resets_consecutive_failures(target: Target, sender) -> None:
    sim = Simulator(seed=7, shape="full")
    hook = sim.add_webhook(target.url, secret=SECRET)
    target.statuses = [500, 500, 500]
    s = await sender(sim, time_scale=0.00001, concurrency=1)
    for _ in range(3):
        s.publish(sim.add_job("image"))
    await s.wait_settled()
    assert hook.consecutive_failures == 0
    target.statuses = [500, 500]
    target.default = 500
    s.publish(sim.add_job("image"))
    await wait_for_requests(target, len(target.requests) + 2)
    assert hook.consecutive_failures >= 2


# ------------------------------------------------------------------ disabling


async def test_the_subscription_is_disabled_at_100_consecutive_failures(
    target: Target, sender, aiohttp_client
) -> None:
    sim = Simulator(seed=8, shape="full")
    hook = sim.add_webhook(target.url, secret=SECRET)
    healthy = sim.add_webhook(target.url, ["job.failed"], secret="whsec_healthy")
    target.default = 500
    s = await sender(sim, time_scale=0.000001, concurrency=1)
    events = 15  # 15 x 7 attempts would be 105 failures
    for _ in range(events):
        s.publish(sim.add_job("image"))
    await s.wait_settled()

    assert hook.active is False
    assert hook.consecutive_failures == DISABLE_AFTER_FAILURES
    assert len(target.requests) == DISABLE_AFTER_FAILURES  # deliveries stopped right there
    states = s.summary().states
    assert states["stopped"] + states["exhausted"] == events
    assert states["stopped"] >= 1
    assert {d.stop_reason for d in s.deliveries if d.state == "stopped"} == {
        "subscription disabled"
    }
    # Nothing more is sent to it; other subscriptions are unaffected.
    assert s.publish(sim.add_job("image")) == []
    assert [d.webhook_id for d in s.publish(sim.add_failed_job("image"))] == [healthy.id]
    # The API shows it as the upstream would.
    client = await aiohttp_client(sim.create_app())
    listed = {
        h["id"]: h for h in (await (await client.get("/v1/webhooks", headers=AUTH)).json())["data"]
    }
    assert listed[hook.id]["active"] is False
    assert listed[hook.id]["consecutive_failures"] == 100
    assert listed[healthy.id]["active"] is True


async def test_deleting_the_subscription_stops_its_retries(
    target: Target, sender, aiohttp_client
) -> None:
    sim = Simulator(seed=9, shape="full")
    hook = sim.add_webhook(target.url, secret=SECRET)
    target.default = 500
    s = await sender(sim, time_scale=0.001)  # retries 60 ms, 300 ms, 1.8 s, ...
    (delivery,) = s.publish(sim.add_job("logo"))
    await wait_for_requests(target, 2)
    client = await aiohttp_client(sim.create_app())
    assert (await client.delete(f"/v1/webhooks/{hook.id}", headers=AUTH)).status == 204
    await asyncio.wait_for(s.wait_settled(), 10)
    assert delivery.state == "stopped"
    assert delivery.stop_reason == "subscription deleted"
    assert len(target.requests) <= 3


# ------------------------------------------------------------------ faults


async def test_duplicates_send_the_same_bytes_twice(target: Target, sender) -> None:
    sim = Simulator(seed=10, shape="full")
    sim.add_webhook(target.url, secret=SECRET)
    s = await sender(sim, faults=DeliveryFaults(duplicate_fraction=1.0))
    payloads = [sim.add_job("image"), sim.add_job("animation")]
    for payload in payloads:
        s.publish(payload)
    await s.wait_settled()

    assert len(target.requests) == 4
    ids = [headers["Service-Event-Id"] for headers, _ in target.requests]
    assert sorted(ids) == sorted([p["id"] for p in payloads] * 2)
    for payload in payloads:
        bodies = {
            body
            for headers, body in target.requests
            if headers["Service-Event-Id"] == payload["id"]
        }
        assert len(bodies) == 1
    summary = s.summary()
    assert (summary.events, summary.deliveries, summary.duplicates) == (2, 4, 2)
    assert len(summary.latencies) == 2  # per event, not per duplicate


async def test_held_back_events_arrive_after_later_ones(target: Target, sender) -> None:
    sim = Simulator(seed=11, shape="full")
    sim.add_webhook(target.url, secret=SECRET)
    s = await sender(sim, faults=DeliveryFaults(out_of_order_fraction=1.0, hold_back_seconds=0.4))
    first = sim.add_job("image")
    (held,) = s.publish(first)
    s.faults = DeliveryFaults()
    second = sim.add_job("logo")
    s.publish(second)
    await s.wait_settled()

    assert held.held_back
    assert [b["id"] for b in target.bodies()] == [second["id"], first["id"]]
    assert first["timestamp"] <= second["timestamp"]
    assert s.summary().held_back == 1
