"""A command's progress on stderr: one line redrawn in place on a terminal, a line each time
otherwise (logs, CI, a cron job's mail)."""

from __future__ import annotations

from typing import TextIO


class ProgressLine:
    """:meth:`show` a line of progress; :meth:`finish` ends it (a newline after a redrawn
    line, so what follows starts on a line of its own)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._tty = out.isatty()
        self._drawn = False

    def show(self, text: str) -> None:
        if self._tty:
            self._out.write("\r" + text)
            self._drawn = True
        else:
            self._out.write(text + "\n")
        self._out.flush()

    def finish(self) -> None:
        if self._drawn:
            self._out.write("\n")
            self._out.flush()
