"""A command's progress line on standard error: on a terminal it is rewritten in place as often as it changes;
anywhere else (a file, a pipe, a CI log) each step is printed once, as a line of its own, since a log shows
every carriage-return rewrite as a repeated line."""

from __future__ import annotations

import sys
from typing import Hashable, TextIO


class ProgressLine:
    """`update(line, step)`: the newest state; off a terminal, printed only when `step` differs from the step last
    printed (None: never), so several updates of one step (each decoded chunk of one decoder call, say) make
    one line. `done(line, step)`: the final state, ending the line; off a terminal printed unless its step was
printed last (the last update already said it)."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.terminal = self.stream.isatty()
        self._printed_step: Hashable = object()
        self._width = 0  # of what stands on the terminal's line now (0: nothing of ours)

    def update(self, line: str, step: Hashable = None) -> None:
        if self.terminal:
            self._rewrite(line, end="")
        elif step is not None and step != self._printed_step:
            self._printed_step = step
            print(line, file=self.stream, flush=True)

    def done(self, line: str, step: Hashable = None) -> None:
        if self.terminal:
            self._rewrite(line, end="\n")
            self._width = 0
        elif step is None or step != self._printed_step:
            self._printed_step = step
            print(line, file=self.stream, flush=True)

    def __enter__(self) -> "ProgressLine":
        return self

    def __exit__(self, *failure) -> None:
        """A line left open on the terminal (the command failed or was interrupted) is ended, so that what is
        printed next starts a line of its own."""
        if self.terminal and self._width:
            print(file=self.stream, flush=True)
            self._width = 0

    def _rewrite(self, line: str, end: str) -> None:
        padding = " " * max(0, self._width - len(line))  # a shorter line covers all of the longer one before it
        print("\r" + line + padding, end=end, file=self.stream, flush=True)
        self._width = len(line)
