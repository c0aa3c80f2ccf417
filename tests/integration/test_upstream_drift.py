"""Noticing when the upstream changes, against a hand-written upstream (not the simulator).

``receiver upstream check`` runs as its own process against documents served by
:class:`tests.support.openapi_upstream.OpenApiUpstream`; the check inside ``receiver serve``
(:class:`receiver.upstream.spec_check.SpecCheck`) runs in-process, beside events that it must
never delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from receiver.app import Runtime
from receiver.config.load import parse_settings
from receiver.config.settings import Settings
from receiver.observe.metrics import Metrics
from receiver.upstream.openapi import SpecError
from receiver.upstream.spec_check import SpecCheck
from receiver.upstream.spec_source import MAX_SPEC_BYTES, read_upstream_document
from tests.support import openapi_variants as variants
from tests.support.cli import assert_one_clean_line, run_cli
from tests.support.helpers import free_port, write_config
from tests.support.openapi_upstream import OpenApiUpstream, serve_openapi_upstream
from tests.support.pipeline import FAST_WORKER, download_sink, send, settled

SECRET = "whsec_drift"
API_KEY = "service_" + "ab" * 32
MB = 1024 * 1024


@pytest.fixture
async def upstream(aiohttp_server):
    served = await serve_openapi_upstream(aiohttp_server)
    yield served
    served.release()  # a request still hanging ends before the server does


def config(tmp_path: Path, base_url: str, timeout: float = 5) -> Path:
    return write_config(
        tmp_path / "config.toml",
        {
            "webhook": {"secrets": [SECRET]},
            "api": {"base_url": base_url, "timeout_seconds": timeout},
        },
    )


async def check(tmp_path: Path, upstream: OpenApiUpstream, *args: str, timeout: float = 5):
    return await run_cli(
        "upstream", "check", "--config", str(config(tmp_path, upstream.base_url, timeout)), *args
    )


# --- receiver upstream check -------------------------------------------------------------------


@pytest.mark.parametrize(
    "document",
    [
        variants.baseline_doc,
        variants.relaid_out_30,
        variants.relaid_out_31,
        variants.unread_parts_changed,
    ],
)
async def test_nothing_that_matters_changed_exits_0(
    tmp_path, upstream, document: Callable[[], dict[str, Any]]
) -> None:
    upstream.serve(document())
    code, out, err = await check(tmp_path, upstream)
    assert (code, err) == (0, ""), out + err
    assert "upstream revision 1.14.0, built against 1.14.0, api.version 2026-08-20" in out
    assert "nothing the receiver reads changed" in out


@pytest.mark.parametrize(
    ("document", "where"),
    [
        (variants.operation_removed, "GET /assets/{id}"),
        (variants.field_removed, "asset.file_url (GET /assets/{id})"),
        (variants.field_retyped, "webhook.consecutive_failures (GET /webhooks)"),
        (variants.field_newly_nullable, "job.type (GET /jobs/{id})"),
        (variants.job_status_value_added, "job.status (GET /jobs/{id})"),
        (variants.required_query_parameter_added, "GET /jobs/{id}"),
    ],
)
async def test_a_breaking_change_exits_1_and_is_listed(
    tmp_path, upstream, document: Callable[[], dict[str, Any]], where: str
) -> None:
    upstream.serve(document())
    code, out, err = await check(tmp_path, upstream)
    assert (code, err) == (1, ""), out + err
    lines = out.splitlines()
    assert lines[1].split() == ["SEVERITY", "WHERE", "CHANGE"]
    assert any(line.startswith("breaking") and where in line for line in lines[2:]), out
    assert lines[-1].endswith("notice(s)") and not lines[-1].startswith("0 breaking")


async def test_notices_exit_0_and_json_tells_the_same(tmp_path, upstream) -> None:
    document = variants.deprecated()
    document["info"]["version"] = "1.15.0"
    upstream.serve(document)
    code, out, err = await check(tmp_path, upstream)
    assert (code, err) == (0, "")
    assert "upstream revision 1.15.0, built against 1.14.0" in out
    assert sum(line.startswith("notice") for line in out.splitlines()) == 3, out
    code, out, _err = await check(tmp_path, upstream, "--json")
    report = json.loads(out)
    assert code == 0 and report["counts"] == {"breaking": 0, "notice": 3}
    assert report["revision"] == "1.15.0" and report["baseline"] == "1.14.0"
    assert report["error"] is None and report["api_version"] == "2026-08-20"
    assert {"severity": "notice", "where": "GET /webhooks", "change": "marked deprecated"} in (
        report["findings"]
    )


async def test_the_document_is_asked_for_with_the_pinned_version(tmp_path, upstream) -> None:
    upstream.serve(variants.baseline_doc())
    await check(tmp_path, upstream)
    [headers] = upstream.spec_requests
    assert headers["Service-API-Version"] == "2026-08-20"
    assert "Authorization" not in headers  # no key configured: none sent


@pytest.mark.parametrize(
    ("prepare", "says"),
    [
        (lambda up: up.serve(b"<html>down for maintenance</html>"), "is not JSON"),
        (lambda up: up.serve(b"{}", status=503), "answered 503"),
        (lambda up: up.serve(variants.not_openapi()), "not an OpenAPI 3.0 or 3.1 document"),
        (lambda up: up.serve(variants.ref_cycle()), "$ref cycle"),
        (lambda up: up.stream(50 * MB), "larger than 10 MB: refused"),
        (lambda up: up.stream(50 * MB, declared=True), "larger than 10 MB: refused"),
        (lambda up: up.hang(), "did not answer within 0.5s"),
    ],
)
async def test_a_document_that_cannot_be_read_exits_2_with_one_line(
    tmp_path, upstream, prepare: Callable[[OpenApiUpstream], None], says: str
) -> None:
    prepare(upstream)
    code, out, err = await check(tmp_path, upstream, timeout=0.5)
    assert code == 2 and out == "", out
    assert_one_clean_line(err)
    assert len(err.strip().splitlines()) == 1 and says in err, err


async def test_an_upstream_that_cannot_be_reached_exits_2(tmp_path) -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    code, out, err = await run_cli("upstream", "check", "--config", str(config(tmp_path, base_url)))
    assert code == 2 and out == ""
    assert_one_clean_line(err)
    assert "could not be reached" in err and len(err.strip().splitlines()) == 1


# --- reading a document stays bounded ----------------------------------------------------------


def api(upstream: OpenApiUpstream, timeout: float = 5) -> Settings:
    return parse_settings(
        {
            "webhook": {"secrets": [SECRET]},
            "api": {"base_url": upstream.base_url, "api_key": API_KEY, "timeout_seconds": timeout},
        },
        env={},
    )


async def test_a_50_mb_document_is_refused_without_holding_it(upstream) -> None:
    upstream.stream(50 * MB)
    settings = api(upstream)
    async with aiohttp.ClientSession() as session:
        tracemalloc.start()
        try:
            with pytest.raises(SpecError) as raised:
                await read_upstream_document(session, settings.api)
            _now, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert "larger than 10 MB" in raised.value.message
    # What is read is at most the cap (and a chunk): never the 50 MB the upstream sends.
    assert peak < MAX_SPEC_BYTES * 2.5, f"{peak / MB:.1f} MB held"


# --- the check inside receiver serve ------------------------------------------------------------


def gauge(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_the_last_document_read_is_kept_when_a_later_one_cannot_be(upstream) -> None:
    metrics = Metrics()
    settings = api(upstream)
    async with aiohttp.ClientSession() as session:
        spec_check = SpecCheck(settings=settings, session=session, metrics=metrics)
        assert gauge(metrics, "receiver_upstream_drift", severity="breaking") == 0
        assert gauge(metrics, "receiver_upstream_drift", severity="notice") == 0

        document = variants.job_status_value_added()
        document["info"]["version"] = "1.16.0"
        upstream.serve(document)
        with capture_logs() as logs:
            first = await spec_check.check()
            again = await spec_check.check()
        assert first.exit_code == again.exit_code == 1 and first.revision == "1.16.0"
        warned = [e for e in logs if e["log_level"] == "warning"]
        assert [e["where"] for e in warned] == ["job.status (GET /jobs/{id})"]  # once
        assert gauge(metrics, "receiver_upstream_drift", severity="breaking") == 1
        info = {"revision": "1.16.0", "api_version": "2026-08-20"}
        assert gauge(metrics, "receiver_upstream_spec_info", **info) == 1

        for broken in (variants.ref_cycle(), b"not json", variants.not_openapi()):
            upstream.serve(broken)
            with capture_logs() as logs:
                kept = await spec_check.check()
            assert kept.error is not None and "\n" not in kept.error
            assert kept.revision == "1.16.0" and kept.findings == first.findings
            assert spec_check.report is kept and kept.exit_code == 2
            assert [e["last_revision"] for e in logs if e["log_level"] == "warning"] == ["1.16.0"]
            assert gauge(metrics, "receiver_upstream_drift", severity="breaking") == 1
            assert gauge(metrics, "receiver_upstream_spec_info", **info) == 1

        upstream.serve(variants.baseline_doc())
        fixed = await spec_check.check()
        assert fixed.error is None and fixed.findings == [] and fixed.revision == "1.14.0"
        assert gauge(metrics, "receiver_upstream_drift", severity="breaking") == 0
        assert gauge(metrics, "receiver_upstream_spec_info", **info) is None  # the old series
        info["revision"] = "1.14.0"
        assert gauge(metrics, "receiver_upstream_spec_info", **info) == 1


def serve_settings(upstream: OpenApiUpstream, tmp_path: Path) -> Settings:
    return parse_settings(
        {
            "webhook": {"secrets": [SECRET]},
            "api": {"base_url": upstream.base_url, "api_key": API_KEY, "timeout_seconds": 5},
            "store": {"url": f"sqlite:///{tmp_path}/inbox.db"},
            "worker": FAST_WORKER,
            "sinks": [download_sink(tmp_path / "dl")],
        },
        env={},
    )


async def test_a_slow_document_never_delays_events_and_its_look_arrives_later(
    upstream, tmp_path, aiohttp_client
) -> None:
    upstream.serve(variants.field_removed())
    upstream.hang()
    job_id = str(uuid.uuid4())
    # An object breaking the spec on a field the receiver reads is used all the same.
    upstream.jobs[job_id] = {"id": job_id, "status": "failed", "type": "logo", "collection_id": 7}
    event = {"id": str(uuid.uuid4()), "object": "event", "event": "job.failed", "job_id": job_id}
    with capture_logs() as logs:
        async with Runtime(serve_settings(upstream, tmp_path)) as runtime:
            assert runtime.spec_check is not None
            client = await aiohttp_client(runtime.public_app())
            await send(client, event, SECRET)
            await settled(runtime, event["id"])
            assert runtime.upstream_drift is None  # the document has not come yet
            assert len(upstream.spec_requests) == 1
            upstream.release()
            report = await runtime.spec_check.wait_checked()
            assert runtime.upstream_drift is report and report.exit_code == 1
            metrics = runtime.metrics
            invalid = {"object": "job", "field": "collection_id"}
            assert gauge(metrics, "receiver_upstream_invalid_total", **invalid) == 1
    broken = [e for e in logs if e.get("field") == "collection_id"]
    assert [e["expected"] for e in broken] == ["string or null"]


async def test_a_process_without_workers_or_key_does_not_look(upstream, tmp_path) -> None:
    settings = serve_settings(upstream, tmp_path)
    assert SpecCheck.wanted(settings, runs_workers=True)
    assert not SpecCheck.wanted(settings, runs_workers=False)
    keyless = parse_settings({"webhook": {"secrets": [SECRET]}}, env={})
    assert not SpecCheck.wanted(keyless, runs_workers=True)


async def test_a_look_that_could_not_read_the_document_is_tried_again_sooner(
    upstream: OpenApiUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upstream answering 503 at start is read again after RETRY_SECONDS (doubling), not
    only at the next regular look an hour later."""
    from receiver.upstream import spec_check as module

    monkeypatch.setattr(module, "RETRY_SECONDS", 0.05)
    upstream.serve({"code": "unavailable"}, status=503)
    async with aiohttp.ClientSession() as session:
        spec_check = SpecCheck(settings=api(upstream), session=session, metrics=Metrics())
        assert spec_check.interval == 3600  # the regular look: once an hour
        running = asyncio.ensure_future(spec_check.run())
        try:
            first = await spec_check.wait_checked()
            assert first.error is not None and first.exit_code == 2
            upstream.serve(variants.baseline_doc())
            for _ in range(200):
                if spec_check.report is not None and spec_check.report.error is None:
                    break
                await asyncio.sleep(0.05)
            report = spec_check.report
            assert report is not None and report.error is None, report
            assert report.exit_code == 0 and report.revision == "1.14.0"
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
