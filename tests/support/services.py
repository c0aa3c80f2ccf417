"""Skipping (or failing, in CI) a test whose local service or deploy tool is absent.

Tests that need a local service (Postgres, Redis, RabbitMQ, NATS) call :func:`require_service`:
it skips with the reason when the service is absent, unless ``RECEIVER_REQUIRE_SERVICES=1``
(as in CI), where a missing service fails the test instead. Tests that run a deploy tool
(caddy, prometheus, hadolint, ...) call :func:`require_tool` the same way.
"""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import sys
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest


def service_reachable(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip (or fail, under RECEIVER_REQUIRE_SERVICES=1) unless host:port accepts connections."""
    if service_reachable(host, port):
        return
    _missing(f"{name} is not reachable at {host}:{port}")


def _missing(reason: str) -> NoReturn:
    if os.environ.get("RECEIVER_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} (RECEIVER_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


# --- deploy tools ---------------------------------------------------------------------------


def find_tool(name: str) -> str | None:
    """The path of a command on PATH, in this interpreter's bin directory (the venv) or in an
    sbin directory (nginx lives there, off a non-root user's PATH)."""
    extra = os.pathsep.join([str(Path(sys.executable).parent), "/usr/sbin", "/sbin"])
    return shutil.which(name) or shutil.which(name, path=extra)


def require_tool(name: str, installed_by: str = "make deploy-tools") -> str:
    """The tool's path; skip (or fail, under RECEIVER_REQUIRE_SERVICES=1) when it is absent."""
    path = find_tool(name)
    if path is None:
        _missing(f"{name} is not installed (run `{installed_by}`)")
    return path


def require_module(name: str, installed_by: str = "make deploy-tools") -> ModuleType:
    """The imported module; skip (or fail, under RECEIVER_REQUIRE_SERVICES=1) when it is absent."""
    try:
        return importlib.import_module(name)
    except ImportError:
        _missing(f"the Python module {name} is not installed (run `{installed_by}`)")
