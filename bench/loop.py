"""Run a module on a chosen event loop: ``python -m bench.loop asyncio|uvloop MODULE ARGS...``.

``receiver serve`` (and the baselines, through the same ``receiver.cli.common.run_async``) use
uvloop whenever it is importable; ``asyncio`` hides it so a run can compare both loops on one
install.
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in ("asyncio", "uvloop"):
        sys.exit("usage: python -m bench.loop asyncio|uvloop MODULE [ARGS...]")
    loop, module = sys.argv[1], sys.argv[2]
    if loop == "asyncio":
        sys.modules["uvloop"] = None  # type: ignore[assignment]  # makes `import uvloop` fail
    else:
        import uvloop  # type: ignore[import-not-found]  # noqa: F401 - fail early if missing
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
