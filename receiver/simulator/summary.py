"""The summary ``receiver simulate`` prints when it ends, and its exit status, from
:meth:`receiver.simulator.run.Simulation.summary`."""

from __future__ import annotations

from typing import Any


def render_summary(summary: dict[str, Any]) -> str:
    """The lines ``receiver simulate`` prints at the end, from :meth:`Simulation.summary`."""
    d = summary["delivery"]
    generated = summary["events_generated"]
    states, outcomes = d["states"], d["outcomes"]
    kinds = ", ".join(f"{kind} {count}" for kind, count in generated.items()) or "none"
    hooks = d["subscriptions"]
    missing = summary.get("receiver_fetches_missing", 0)
    answers = [
        f"2xx {outcomes['2xx']}",
        f"4xx {outcomes['4xx']}",
        f"5xx {outcomes['5xx']}",
        f"timeouts {outcomes['timeout']}",
        f"network errors {outcomes['error']}",
    ]
    answers += [f"{k} {outcomes[k]}" for k in ("1xx", "3xx") if outcomes.get(k)]
    lines = [
        "simulator summary",
        f"  events sent       {d['events']} ({kinds}); {d['events_delivered']} got a 2xx",
        *(
            [f"  without webhook   {summary['jobs_without_webhook']} jobs (found only by polling)"]
            if summary.get("jobs_without_webhook")
            else []
        ),
        f"  deliveries        {d['deliveries']} to {len(hooks)} subscription(s) "
        f"({d['duplicates']} duplicates, {d['held_back']} held back out of order)",
        f"                    {states['delivered']} delivered, {states['exhausted']} given up "
        f"after 7 attempts, {states['stopped']} stopped, {states['scheduled']} still retrying",
        f"  attempts          {d['attempts']}: " + ", ".join(answers),
        "  latency to 2xx    " + _latency_line(d["latency_seconds"]),
        f"  receiver fetched  the job and assets of {d['events_delivered'] - missing} of "
        f"{d['events_delivered']} delivered events",
    ]
    for hook in hooks:
        lines.append(
            f"  subscription      {hook['id']} {hook['url']} "
            f"{'active' if hook['active'] else 'INACTIVE'}, "
            f"consecutive_failures {hook['consecutive_failures']}"
        )
    for route, statuses in summary["api"].items():
        answered = ", ".join(f"{status} x{count}" for status, count in statuses.items())
        lines.append(f"  API served        {route}: {answered}")
    seed = summary.get("seed")
    if seed is not None:
        shape = summary.get("shape", "mixed")
        lines.append(
            f"  seed              {seed}, shape {shape} (--seed {seed} --shape {shape} repeats "
            "this run, event ids too)"
        )
    return "\n".join(lines)


def _latency_line(stats: dict[str, float] | None) -> str:
    if not stats:
        return "no event delivered"
    return (
        f"{int(stats['count'])} events: min {_secs(stats['min'])}, "
        f"p50 {_secs(stats['p50'])}, p90 {_secs(stats['p90'])}, max {_secs(stats['max'])}"
    )


def _secs(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def all_delivered(summary: dict[str, Any]) -> bool:
    """True when every delivery got a 2xx (the exit status of ``--until-done``/``--duration``)."""
    states = summary["delivery"]["states"]
    return bool(states["delivered"] == summary["delivery"]["deliveries"])
