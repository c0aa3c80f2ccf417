"""The event page's timeline drawing, from a record and its steps (receiver.web.timeline)."""

from __future__ import annotations

from receiver.store.records import DeliveryRecord, EventRecord
from receiver.store.steps import Step
from receiver.web.timeline import LABELS, MIN_BAR, WIDTH, build, duration

T0 = 1_700_000_000.0


def record(stored_at: float | None) -> EventRecord:
    delivery = DeliveryRecord("ev", "peer", "done", 2, None, None, T0 + 600)
    return EventRecord(
        id="ev", event="job.completed", job_id="j", body=b"{}", headers={},
        received_at=T0, state="done", deliveries=(delivery,), stored_at=stored_at,
    )  # fmt: skip


def step(kind: str, sink: str, start: float, seconds: float, outcome: str) -> Step:
    name = "GET /jobs/{id}" if kind == "upstream" else sink
    status = 500 if outcome == "retry" else 200
    error = "HTTP 500" if outcome == "retry" else None
    return Step(kind, sink, name, 1, T0 + start, T0 + start + seconds, outcome, error, status)  # type: ignore[arg-type]


def test_a_late_delivery_shows_where_its_time_went():
    steps = [
        step("upstream", "", 0.1, 0.05, "200"),
        step("attempt", "peer", 0.2, 0.02, "retry"),
        step("attempt", "peer", 600.0, 0.002, "delivered"),
    ]
    drawn = build(record(T0 + 0.004), steps)
    assert [b.css for b in drawn.bars] == [
        "step call",
        "step attempt retry",
        "step attempt delivered",
    ]
    assert all(b.width >= MIN_BAR for b in drawn.bars)  # 2 ms in 10 min is still visible
    assert drawn.bars[-1].x + drawn.bars[-1].width <= WIDTH
    assert drawn.bars[0].x >= LABELS
    assert [m.css for m in drawn.marks] == ["mark", "mark stored"]
    assert "HTTP 500" in drawn.bars[1].title and "attempt 1: retry" in drawn.bars[1].title
    assert [line.error for line in drawn.lines] == [None, "HTTP 500", None]
    assert drawn.total == "10 min 00 s"
    assert [label.text for label in drawn.labels] == ["inbox", "fetch job", "peer"]


def test_a_stored_time_from_another_clock_stays_within_the_timeline():
    drawn = build(record(T0 - 30.0), [step("attempt", "peer", 1.0, 0.5, "delivered")])
    received, stored = drawn.marks
    assert stored.x == received.x  # never before the receipt
    assert build(record(None), []).lines == ()


def test_durations_read_as_people_say_them():
    assert [duration(s) for s in (0.0123, 1.25, 185)] == ["12 ms", "1.25 s", "3 min 05 s"]
