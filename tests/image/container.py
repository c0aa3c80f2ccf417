"""The built image, inspected and run with buildah (no container engine daemon needed).

``buildah from`` makes a working container from the image and ``buildah run --isolation chroot
--network host`` runs a command in it as the image's user, with its environment, working
directory and the volumes given. Where ``podman run`` works, it would do the same; in sandboxes
without usable cgroups only this does. Signals go to the receiver process itself (as a
container engine's stop sends them to the container's main process): buildah would kill it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

RUN = ("buildah", "run", "--isolation", "chroot", "--network", "host")


class CheckFailed(AssertionError):
    """One of the image test's promises does not hold."""


def check(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


async def command(*argv: str, timeout: float = 120.0) -> tuple[int, str]:
    """Run a host command: (exit status, stdout and stderr together)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode(errors="replace")


async def inspect_image(image: str) -> dict[str, Any]:
    """``podman image inspect``: Config (User, Env, Entrypoint...), Healthcheck, Size."""
    status, out = await command("podman", "image", "inspect", image)
    check(status == 0, f"podman image inspect {image}: {out.strip()}")
    found: dict[str, Any] = json.loads(out)[0]
    return found


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before children."""
    tree, found, queue = _children(), [], [pid]
    while queue:
        for child in tree.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def process_uid(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    return None


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Container:
    """A working container of the image: its main command, and commands run beside it."""

    def __init__(self, image: str, name: str, log_path: Path) -> None:
        self.image = image
        self.name = name
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self.env: dict[str, str] = {}
        self.volumes: dict[Path, str] = {}

    async def create(self) -> None:
        await command("buildah", "rm", self.name)  # a leftover of an interrupted run
        status, out = await command(
            "buildah", "from", "--pull=never", "--name", self.name, self.image
        )
        check(status == 0, f"buildah from {self.image}: {out.strip()}")
        # buildah gives an image VOLUME a private directory that hides a bind mount on the same
        # path; a container engine mounts the operator's volume there instead: do the same.
        volumes = (await inspect_image(self.image))["Config"].get("Volumes") or {}
        for path in volumes:
            await command("buildah", "config", "--volume", f"{path}-", self.name)

    def _argv(self, argv: list[str], env: dict[str, str], volumes: dict[Path, str]) -> list[str]:
        options = [f"--env={key}={value}" for key, value in env.items()]
        options += [f"--volume={host}:{inside}" for host, inside in volumes.items()]
        return [*RUN, *options, self.name, "--", *argv]

    async def start(self, argv: list[str], env: dict[str, str], volumes: dict[Path, str]) -> None:
        """Start the main command (the image's entrypoint and arguments) in the background."""
        self.env, self.volumes = env, volumes
        log = self.log_path.open("ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self._argv(argv, env, volumes), stdout=log, stderr=log
            )
        finally:
            log.close()

    async def run(self, argv: list[str]) -> tuple[int, str]:
        """Run a command beside the main one, with its environment and volumes (as an engine
        runs a HEALTHCHECK or ``exec``) and wait: (exit status, output)."""
        return await command(*self._argv(argv, self.env, self.volumes))

    def main_pid(self) -> int:
        """The main command's process (what a container engine signals on stop)."""
        check(self.proc is not None and self.proc.returncode is None, f"{self.name} is not running")
        assert self.proc is not None
        for pid in descendants(self.proc.pid):
            if "buildah" not in process_name(pid):  # its runtime shows as memfd:buildah-c...
                return pid
        raise CheckFailed(f"{self.name}: no process found inside the container")

    def inside_pids(self) -> list[int]:
        """Every process running inside the container (below buildah's chroot runtime)."""
        pid = self.main_pid()
        return [pid, *descendants(pid)]

    async def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send ``sig`` to the main process; its exit status (CheckFailed after ``timeout``)."""
        os.kill(self.main_pid(), sig)
        return await self.wait(timeout)

    async def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            raise CheckFailed(f"{self.name} still runs {timeout:.0f} s after the signal") from None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def remove(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            for pid in reversed(descendants(self.proc.pid)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        await command("buildah", "rm", self.name)
