"""What a benchmark reads of a server process from /proc (Linux): memory, CPU time, open files."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def rss_mb(pid: int) -> float:
    """Resident set size of a process now, in MiB (Linux)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) of a process and of its child processes so far.

    Per request, this is what a server's work costs, whatever else shares the machine: unlike
    its rate, it does not count the time the server waited for a core.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # After the command's name (in parentheses, which may hold spaces): state, ppid...
            fields = stat.read_text().rpartition(")")[2].split()
            if int(stat.parent.name) == pid or int(fields[1]) == pid:
                total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def command_cpu(command: str) -> dict[int, float]:
    """CPU time (user + system) so far of each process named ``command`` (its ``comm``), by
    pid, e.g. ``postgres``: the database server's postmaster, backends and background writers,
    all of which share the machine with the server being measured."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            head, _, tail = stat.read_text().rpartition(")")
            if head.partition("(")[2] == command:
                fields = tail.split()
                found[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def cpu_since(before: dict[int, float], after: dict[int, float]) -> float:
    """The CPU time the processes of ``after`` spent since ``before`` was read: a process that
    ended in between takes its time with it (never a negative total), one that started counts
    whole."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def peak_rss_mb(pid: int) -> float:
    """The kernel's high-water mark of the process's resident set (VmHWM), in MiB."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> tuple[int, int]:
    """The process's open file descriptors, and how many of them are sockets (a server's
    connections among them, which come and go with the load)."""
    directory = f"/proc/{pid}/fd"
    try:
        names = os.listdir(directory)
    except OSError:
        return 0, 0
    sockets = 0
    for name in names:
        with contextlib.suppress(OSError):
            sockets += os.readlink(f"{directory}/{name}").startswith("socket:")
    return len(names), sockets


def socket_ports(pid: int) -> list[tuple[int, int]]:
    """(local port, remote port) of each TCP socket the process holds open (IPv4 and IPv6;
    a listening socket's remote port is 0). Read from /proc/PID/net/tcp{,6}, matched to the
    process's descriptors by inode."""
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for name in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{name}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports: list[tuple[int, int]] = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[9] in inodes:
                    local = int(fields[1].rpartition(":")[2], 16)
                    remote = int(fields[2].rpartition(":")[2], 16)
                    ports.append((local, remote))
    return ports
