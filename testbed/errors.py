"""What goes wrong in a run, shared by both backends, the sweep and the command line.

The command line maps them to exit codes: :class:`RunRefused` (bad input, a machine too small;
nothing was started or changed) exits 2, any other :class:`RunError` exits 1.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

#: Progress lines for the user (one line per call, no trailing newline).
Say = Callable[[str], None]


class RunError(RuntimeError):
    """The run could not be carried out; the message says what and where."""


class RunRefused(RunError):
    """The run was refused before anything started (bad input, too big for this machine)."""


class RankFailed(RunError):
    """A rank process failed; ``rank`` and its last op are in the message."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(message)
        self.rank = rank


def say_stderr(msg: str) -> None:
    """The default :data:`Say`: a plain line on standard error."""
    print(msg, file=sys.stderr, flush=True)


def require_empty_dir(out: Path) -> None:
    """Refuse an output directory that already holds something (nothing is changed)."""
    if out.exists() and any(out.iterdir()):
        raise RunRefused(f"{out} exists and is not empty; choose another --out (nothing was "
                         "changed)")
