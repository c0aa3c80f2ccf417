"""``python -m tests.image --image NAME [--only sqlite|postgres]``: exit 0 when all checks hold."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.image import audit, postgres_run, sqlite_run
from tests.image.container import CheckFailed, Container, inspect_image


class Reporter:
    """One timestamped line per step, as CI shows it."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.section = ""

    def __call__(self, line: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {self.section:9} {line}", flush=True)


async def inspect(image: str, revision: str | None, work: Path, say: Reporter) -> dict[str, object]:
    meta = await inspect_image(image)
    say(f"{image}: {int(meta['Size']) / 1e6:.0f} MB")
    for line in audit.declared(meta) + audit.labelled(meta, revision):
        say(line)
    container = Container(image, f"receiver-image-test-audit-{os.getpid()}", work / "audit.log")
    await container.create()
    try:
        async with audit.mounted(container.name) as root:
            for line in audit.contents(root):
                say(line)
    finally:
        await container.remove()
    return meta


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.image", description=__doc__)
    parser.add_argument("--image", default="localhost/receiver:latest")
    parser.add_argument("--only", choices=("sqlite", "postgres"))
    parser.add_argument("--revision", help="the commit the image was built from (its label)")
    args = parser.parse_args(argv)
    say = Reporter()
    work = Path(tempfile.mkdtemp(prefix="receiver-image-test-"))
    work.chmod(0o755)
    try:
        say.section = "image"
        meta = await inspect(args.image, args.revision, work, say)
        if args.only != "postgres":
            say.section = "sqlite"
            (work / "sqlite").mkdir()
            await sqlite_run.run(args.image, meta, work / "sqlite", say)
        if args.only != "sqlite":
            say.section = "postgres"
            (work / "postgres").mkdir()
            await postgres_run.run(args.image, meta, work / "postgres", say)
    except (CheckFailed, AssertionError) as exc:
        say(f"FAILED: {exc}")
        print(f"logs kept in {work}", file=sys.stderr)
        return 1
    say.section = ""
    say("every check passed")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
