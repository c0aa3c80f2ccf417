"""A redelivery filter read from people (the admin API, the inbox page, the command line): each
field checked and named when wrong; WHEN as an ISO time or a duration back from now."""

from __future__ import annotations

import pytest

from receiver.cli.redeliver import bar
from receiver.delivery.redelivery import filter_text, read_filter
from receiver.store.batches import BadFilter, Progress, RedeliveryBatch, RedeliveryFilter

NOW = 1_800_000_000.0
SINKS = ("chat", "files")


def test_a_full_filter_and_its_defaults() -> None:
    assert read_filter({}, sinks=SINKS, now=NOW) == RedeliveryFilter(status="dead")
    flt = read_filter(
        {
            "status": "failed",
            "sinks": ["chat", "chat"],
            "event": "job.failed",
            "job_id": "j-1",
            "since": "2h",
            "until": "2027-01-15T08:00:00",
        },
        sinks=SINKS,
        now=NOW,
    )
    assert flt.sinks == ("chat",) and flt.since == NOW - 7200
    assert flt.until == NOW  # 2027-01-15T08:00:00Z: UTC when it names no offset
    assert read_filter({"since": 1.5e9}, sinks=SINKS, now=NOW).since == 1.5e9
    assert read_filter({"since": "2027-01-15T08:00:00+01:00"}, sinks=SINKS, now=NOW).since == (
        NOW - 3600
    )
    assert filter_text(flt) == (
        "status=failed sinks=chat event=job.failed job_id=j-1 since=2027-01-15T06:00:00Z "
        "until=2027-01-15T08:00:00Z"
    )


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"status": "lost"}, "status"),
        ({"sinks": ["nope"]}, "sinks"),
        ({"sinks": [1]}, "sinks"),
        ({"event": ""}, "event"),
        ({"job_id": 3}, "job_id"),
        ({"since": "yesterday"}, "since"),
        ({"until": True}, "until"),
        ({"since": "1h", "until": "2h"}, "until"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_a_bad_field_is_named(data: dict[str, object], field: str) -> None:
    with pytest.raises(BadFilter) as caught:
        read_filter(data, sinks=SINKS, now=NOW)
    assert caught.value.field == field and str(caught.value).startswith(f"{field}: ")


def test_the_progress_bar() -> None:
    batch = RedeliveryBatch(
        "b1", RedeliveryFilter(), "ops", NOW, "running", 10, 10, Progress(5, 1, 0, 4)
    )
    assert bar(batch).startswith("[" + "#" * 18 + "." * 12 + "]  60%  delivered 5  failed 1")
