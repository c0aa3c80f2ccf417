"""The slow-disk shim of bench/ingest: slow_fsync.c compiled at run time, checked, preloaded.

:func:`build` compiles ``slow_fsync.c`` (beside this file) with gcc into ``directory`` and
checks, in a child process, that an ``os.fsync`` under it takes at least the delay; it returns
the environment a server needs to run with it (``LD_PRELOAD`` and ``SLOW_FSYNC_US``). Nothing
compiled is kept: the directory is the benchmark's temporary one.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("slow_fsync.c")

_CHECK = """
import os, sys, tempfile, time
with tempfile.TemporaryFile() as f:
    f.write(b"x")
    started = time.perf_counter()
    for _ in range(5):
        os.fsync(f.fileno())
    print((time.perf_counter() - started) / 5 * 1000)
"""


def build(directory: Path, delay_ms: float) -> dict[str, str]:
    """Compile the shim into ``directory``; the environment that preloads it."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        sys.exit("bench: the slow-fsync targets need gcc (apt-get install gcc)")
    library = directory / "slow_fsync.so"
    subprocess.run(
        [gcc, "-O2", "-shared", "-fPIC", "-o", str(library), str(SOURCE), "-ldl"], check=True
    )
    env = {"LD_PRELOAD": str(library), "SLOW_FSYNC_US": str(round(delay_ms * 1000))}
    took = subprocess.run(
        [sys.executable, "-c", _CHECK], env=env, capture_output=True, text=True, check=True
    )
    if float(took.stdout) < delay_ms:
        sys.exit(f"bench: the slow-fsync shim did not slow fsync ({took.stdout.strip()} ms)")
    return env
