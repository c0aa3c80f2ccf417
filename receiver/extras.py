"""How to install an optional extra, said with the pip of the environment the receiver runs in.

``pip install 'receiver[redis]'`` typed into a shell installs into whatever ``pip`` is first on
PATH, often not the virtualenv the receiver runs from. Running from a virtualenv, the hint names
that virtualenv's pip, relative to the working directory when it lies below it
(``.venv/bin/pip`` in a checkout of the project, where ``make install-all`` installs every extra).
"""

from __future__ import annotations

import sys
from pathlib import Path


def pip_command(
    *, prefix: str | None = None, base_prefix: str | None = None, cwd: Path | None = None
) -> str:
    """The pip that installs into this interpreter's environment, as a user would type it."""
    prefix = sys.prefix if prefix is None else prefix
    base_prefix = sys.base_prefix if base_prefix is None else base_prefix
    if prefix == base_prefix:
        return "pip"
    pip = Path(prefix) / "bin" / "pip"
    try:
        return str(pip.relative_to(cwd or Path.cwd()))
    except ValueError:
        return str(pip)


def install_hint(extra: str, *, cwd: Path | None = None) -> str:
    """``run: .venv/bin/pip install 'receiver[redis]'`` (and ``make install-all`` in a checkout)."""
    cwd = cwd or Path.cwd()
    pip = pip_command(cwd=cwd)
    hint = f"run: {pip} install 'receiver[{extra}]'"
    if not Path(pip).is_absolute() and pip != "pip" and (cwd / "Makefile").is_file():
        hint += " (or `make install-all` for every extra)"
    return hint
