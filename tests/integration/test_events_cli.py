"""`receiver events` as a newcomer meets it: a header, human times, filters, an explicit "no
events" line, JSON, following new events, redelivering one sink, never creating an inbox, and a
quiet exit when the reader of its output goes away."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from receiver.cli import main
from receiver.config.load import parse_settings
from receiver.store import open_store
from receiver.store.records import NewEvent, Outcome
from tests.support.helpers import write_config

SECRET = "whsec_events_cli"


def new_event(n: int, *, event: str = "job.completed", age: float = 0.0, sinks=("files",)):
    body = json.dumps({"id": f"evt-{n}", "object": "event", "event": event, "job_id": f"job-{n}"})
    return NewEvent(
        id=f"evt-{n}",
        event=event,
        job_id=f"job-{n}",
        body=body.encode(),
        headers={},
        received_at=time.time() - age,
        sinks=tuple(sinks),
    )


def add_events(db: Path, events: list[NewEvent], *, dead: tuple[str, str] | None = None) -> None:
    async def add() -> None:
        store = open_store(
            parse_settings(
                {"store": {"url": f"sqlite:///{db}"}}, env={"RECEIVER_WEBHOOK_SECRETS": SECRET}
            ).store
        )
        await store.open()
        try:
            for event in events:
                await store.add_event(event)
            if dead is not None:
                event_id, sink = dead
                await store.settle(
                    event_id, sink, Outcome(state="dead", error="gave up"), now=time.time()
                )
        finally:
            await store.close()

    asyncio.run(add())


@pytest.fixture
def inbox(tmp_path: Path) -> Path:
    """A config (relative SQLite path, like the example's) and its inbox with five events."""
    config = write_config(
        tmp_path / "config.toml",
        {
            "webhook": {"secrets": [SECRET]},
            "store": {"url": "sqlite:///data/inbox.db"},
            "sinks": [
                {"name": "files", "type": "download"},
                {"name": "chat", "type": "slack", "url": "https://hooks.example/x"},
            ],
        },
    )
    (tmp_path / "data").mkdir()
    add_events(
        tmp_path / "data" / "inbox.db",
        [
            new_event(1, age=3 * 3600),
            new_event(2, event="job.failed", age=600, sinks=("chat",)),
            new_event(3, age=180, sinks=("files", "chat")),
            new_event(4, age=30),
            new_event(5, event="job.failed", age=5, sinks=("files", "chat")),
        ],
    )
    return config


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def in_dir(inbox: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(inbox.parent)
    monkeypatch.delenv("RECEIVER_CONFIG", raising=False)
    return inbox


def test_list_has_a_header_human_times_and_each_sinks_state(in_dir, capsys) -> None:
    code, out, err = cli(capsys, "events", "list")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "EVENT", "STATE", "RECEIVED", "DELIVERIES"]
    assert [line.split()[0] for line in lines[1:]] == [f"evt-{n}" for n in (5, 4, 3, 2, 1)]
    row = next(line for line in lines if line.startswith("evt-3"))
    assert "job.completed" in row and "pending" in row
    assert time.strftime("%Y-%m-%dT", time.gmtime(time.time() - 180)) in row
    assert "Z (3 min ago)" in row
    assert row.rstrip().endswith("chat:pending files:pending")
    assert "(3 h ago)" in lines[-1]


def test_list_filters(in_dir, capsys) -> None:
    def ids(*args: str) -> list[str]:
        code, out, err = cli(capsys, "events", "list", *args)
        assert code == 0, err
        return [line.split()[0] for line in out.splitlines()[1:]]

    assert ids("--event", "job.failed") == ["evt-5", "evt-2"]
    assert ids("--sink", "files") == ["evt-5", "evt-4", "evt-3", "evt-1"]
    assert ids("--since", "15m") == ["evt-5", "evt-4", "evt-3", "evt-2"]
    assert ids("--job", "job-4") == ["evt-4"]
    assert ids("--event", "job.completed", "--sink", "chat") == ["evt-3"]
    _code, out, _ = cli(capsys, "events", "list", "--limit", "2")
    assert out.splitlines()[-1] == "(the newest 2; --limit N for more)"


def test_a_dead_delivery_is_found_by_sink_and_status(tmp_path, in_dir, capsys) -> None:
    add_events(
        tmp_path / "data" / "inbox.db", [new_event(6, sinks=("chat",))], dead=("evt-6", "chat")
    )
    _code, out, _ = cli(capsys, "events", "list", "--sink", "chat", "--status", "dead")
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["evt-6"]
    assert "chat:dead(1)" in out


def test_no_match_is_said_not_silent(in_dir, capsys) -> None:
    code, out, err = cli(capsys, "events", "list", "--event", "job.archived", "--since", "1h")
    assert code == 0, err
    db = (in_dir.parent / "data" / "inbox.db").resolve()
    assert out == f"no events matching --event job.archived --since 1h in the inbox ({db})\n"


def test_json(in_dir, capsys) -> None:
    _code, out, _ = cli(capsys, "events", "list", "--json", "--limit", "1")
    [event] = json.loads(out)
    assert event["id"] == "evt-5" and event["event"] == "job.failed"
    assert event["received_at_utc"].endswith("Z") and "payload" not in event
    assert {d["sink"] for d in event["deliveries"]} == {"files", "chat"}


def test_bad_since_and_limit_are_one_line(in_dir, capsys) -> None:
    code, _, err = cli(capsys, "events", "list", "--since", "yesterday")
    assert code == 1 and err.startswith("receiver: --since 'yesterday': give a duration")
    code, _, err = cli(capsys, "events", "list", "--limit", "0")
    assert code == 1 and err == "receiver: --limit must be at least 1\n"


def test_a_missing_inbox_is_an_error_naming_the_path_and_config(
    tmp_path, inbox, capsys, monkeypatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    replay = ["replay", "--from-store", "evt-1", "--url", "http://127.0.0.1:9/w", "--secret", "s"]
    for args in (
        ["events", "list"],
        ["events", "show", "evt-1"],
        ["events", "redeliver", "evt-1"],
        ["events", "tail"],
        replay,
    ):
        code, out, err = cli(capsys, *args, "--config", str(inbox))
        assert code == 1 and out == ""
        assert err.startswith(f"receiver: no inbox at {elsewhere / 'data' / 'inbox.db'} ")
        assert "--config" in err and "relative to the working directory" in err
        assert len(err.splitlines()) == 1
    assert list(elsewhere.iterdir()) == [], "a read command created something"


def test_redeliver_one_sink(in_dir, capsys) -> None:
    code, out, err = cli(capsys, "events", "redeliver", "evt-3", "--sink", "chat")
    assert code == 0, err
    assert out == "the chat delivery of evt-3 made pending again\n"
    code, _, err = cli(capsys, "events", "redeliver", "evt-3", "--sink", "chatt")
    assert code == 1
    assert err == (
        "receiver: event evt-3 has no delivery to sink 'chatt' (did you mean chat?); "
        "its sinks: chat, files\n"
    )
    code, _, err = cli(capsys, "events", "redeliver", "--dead", "--sink", "chat")
    assert code == 1 and "not both" in err


def test_a_mistyped_command_gets_a_suggestion(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["evnets", "list"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err == "receiver: unknown command 'evnets'; did you mean events? (see receiver --help)\n"
    with pytest.raises(SystemExit):
        main(["events", "list", "--evnt", "x"])
    assert "unknown option --evnt; did you mean --event?" in capsys.readouterr().err


def run_receiver(*args: str, cwd: Path, **kwargs) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "receiver", *args],
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("RECEIVER_")},
        **kwargs,
    )


def test_a_closed_pipe_ends_quietly(tmp_path, inbox) -> None:
    add_events(tmp_path / "data" / "inbox.db", [new_event(n, age=n) for n in range(10, 400)])
    done = subprocess.run(
        f"{sys.executable} -m receiver events list --limit 400 | head -n 2",
        shell=True,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.splitlines()[0].startswith("ID")
    assert len(done.stdout.splitlines()) == 2
    assert done.stderr == ""


def test_tail_follows_new_events(tmp_path, inbox) -> None:
    with run_receiver("events", "tail", "--limit", "2", "--interval", "0.1", cwd=tmp_path) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            header = proc.stdout.readline().split()
            assert header == ["ID", "EVENT", "STATE", "RECEIVED", "DELIVERIES"]
            assert proc.stdout.readline().startswith("evt-4 ")
            assert proc.stdout.readline().startswith("evt-5 ")
            # Three arriving together (one receipt time): each printed once, oldest first.
            add_events(tmp_path / "data" / "inbox.db", [new_event(n, age=-1) for n in (7, 8, 9)])
            for n in (7, 8, 9):
                line = proc.stdout.readline()
                assert line.startswith(f"evt-{n} ") and "job.completed" in line
            time.sleep(0.5)  # five more polls: none may print any of them again
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 0
            assert proc.stdout.read() == ""
            assert proc.stderr.read() == ""
        finally:
            if proc.poll() is None:
                proc.kill()
