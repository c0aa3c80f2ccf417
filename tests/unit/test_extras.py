"""The install hint names the pip of the environment the receiver runs in."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from receiver.extras import install_hint, pip_command


def test_outside_a_virtualenv_plain_pip() -> None:
    assert pip_command(prefix="/usr", base_prefix="/usr") == "pip"


def test_a_virtualenv_below_the_working_directory_is_named_relative(tmp_path: Path) -> None:
    venv = tmp_path / ".venv"
    assert pip_command(prefix=str(venv), base_prefix="/usr", cwd=tmp_path) == ".venv/bin/pip"
    elsewhere = pip_command(prefix="/opt/receiver", base_prefix="/usr", cwd=tmp_path)
    assert elsewhere == "/opt/receiver/bin/pip"


def test_the_hint_names_this_interpreters_pip(tmp_path: Path) -> None:
    hint = install_hint("redis", cwd=tmp_path)
    assert hint.startswith("run: ") and hint.endswith("install 'receiver[redis]'")
    assert hint == f"run: {pip_command(cwd=tmp_path)} install 'receiver[redis]'"


def test_in_a_checkout_the_hint_also_names_make_install_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path / ".venv"))
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    assert install_hint("nats", cwd=tmp_path) == "run: .venv/bin/pip install 'receiver[nats]'"
    (tmp_path / "Makefile").write_text("install-all:\n")
    assert install_hint("nats", cwd=tmp_path) == (
        "run: .venv/bin/pip install 'receiver[nats]' (or `make install-all` for every extra)"
    )
