"""A ``receiver`` command imports its own module, not every command's.

Each command starts in a fresh interpreter, so what it imports is time a user waits for at
every run (``receiver events list`` in a loop, a healthcheck every few seconds): loading the web
server, the simulator and every sink for a command that only reads the inbox took twice as long.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from receiver.cli import COMMANDS

# Runs the command line given, then prints the receiver's and aiohttp's modules it loaded.
LOADED = """
import sys
from receiver.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(" ".join(m for m in sys.modules if m.startswith(("receiver", "aiohttp"))))
"""

# Never needed to parse a command line, nor to run one that only reads the inbox or the config.
SERVING = ("aiohttp", "receiver.app", "receiver.simulator", "receiver.sinks", "receiver.web")
# The modules that own a command.
OWNERS = {target.partition(":")[0] for target in COMMANDS.values()}


def loaded(*words: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", LOADED, *words],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return set(done.stdout.split())


def command_modules(modules: set[str]) -> set[str]:
    return modules & OWNERS


@pytest.mark.parametrize(
    "words",
    [
        ("events", "list", "--help"),
        ("lanes", "--help"),
        ("migrate", "status", "--help"),
        ("redeliver", "status", "--help"),
        ("check-config", "--config", "/nonexistent/receiver.toml"),
        ("healthcheck", "--config", "/nonexistent/receiver.toml"),
    ],
    ids=" ".join,
)
def test_a_command_loads_its_own_module_and_nothing_of_serving(words):
    modules = loaded(*words)
    owner = COMMANDS[words[0]].partition(":")[0]
    assert command_modules(modules) == {owner}
    assert not {m for m in modules if m.startswith(SERVING)}


def test_help_and_a_mistyped_command_load_every_command_to_list_them():
    for words in (("--help",), ("evnets",)):
        assert command_modules(loaded(*words)) == OWNERS
