"""What ``receiver serve`` does at start to keep full garbage collections short."""

from __future__ import annotations

import subprocess
import sys

# In a fresh interpreter of its own: freezing the test worker's objects would keep its garbage.
SCRIPT = """
import gc
import receiver.server
from receiver.app import Runtime  # what a serving process has loaded by then
assert gc.get_freeze_count() == 0
before = len(gc.get_objects())
receiver.server.freeze_startup_objects()
frozen = gc.get_freeze_count()
gc.collect()
print(before, frozen, len(gc.get_objects(generation=2)))
"""


def test_the_objects_made_at_start_are_left_out_of_later_collections() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=60
    )
    before, frozen, left = (int(n) for n in done.stdout.split())
    assert frozen >= before * 0.9  # every object tracked at the time (a few made since)
    assert left < before / 10  # a full collection now walks next to none of them
