"""Running the ``receiver`` command as a user does, and checking its one-line errors."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.helpers import ROOT

# The ``receiver`` console script of this venv, as users run it; ``python -m receiver`` where
# the package was not installed with its scripts.
_SCRIPT = Path(sys.executable).with_name("receiver")
RECEIVER = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "receiver"]


async def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    under: Sequence[str] = (),
) -> tuple[int | None, str, str]:
    """``receiver ARGS`` (the console script): (exit code, stdout, stderr). ``under`` is a command
    it runs under (``["prlimit", "--fsize=N"]``: a file size limit standing for a full disk)."""
    proc = await asyncio.create_subprocess_exec(
        *under,
        *RECEIVER,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
        cwd=cwd or ROOT,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    except BaseException:  # cancelled or timed out: the process and its pipes go too
        if proc.returncode is None:
            proc.kill()
        await asyncio.shield(proc.communicate())
        raise
    return proc.returncode, out.decode(), err.decode()


CLEAN_LINE = re.compile(r"receiver( [a-z][a-z-]*)*: ")


def assert_one_clean_line(err: Any) -> None:
    """stderr holds ``receiver: ...`` (or ``receiver COMMAND: ...``) lines only, never a
    traceback."""
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) >= 1
    assert all(CLEAN_LINE.match(line) for line in err.strip().splitlines()), err
