"""Progress display: a tqdm bar over rounds showing the current phase, silent when not wanted.

``mode`` is ``auto`` (shown only when stderr is a terminal), ``on`` or ``off``. When not shown
nothing at all is written, so logs and CI output stay clean.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Iterable, Iterator, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")
PROGRESS_MODES = ("auto", "always", "never")


def progress_shown(mode: str) -> bool:
    """Whether a bar is drawn for ``mode`` (``auto``: only when stderr is a TTY)."""
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress mode {mode!r} is not one of {' | '.join(PROGRESS_MODES)}")
    return mode == "always" or (mode == "auto" and sys.stderr.isatty())


class Progress:
    """A bar over communication rounds whose postfix names the phase being run.

    Args:
        mode: ``auto`` | ``on`` | ``off``.
        total_rounds: the last round index T.
        start_round: rounds already done (a resumed run starts its bar there).
    """

    def __init__(self, mode: str, total_rounds: int, start_round: int = 0) -> None:
        self._bar = (tqdm(total=total_rounds, initial=start_round, desc="rounds", unit="round", file=sys.stderr,
                          dynamic_ncols=True) if progress_shown(mode) else None)

    def phase(self, name: str) -> None:
        """Show ``name`` as the phase now running."""
        if self._bar is not None:
            self._bar.set_postfix_str(f"phase={name}")

    def advance(self) -> None:
        """Count one finished round."""
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        """Remove the bar (idempotent)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def progress_iter(iterable: Iterable[T], desc: str, mode: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a transient inner bar (an attack's training loop); the plain iterable when not shown."""
    if not progress_shown(mode):
        yield from iterable
        return
    yield from tqdm(iterable, desc=desc, total=total, leave=False, file=sys.stderr, dynamic_ncols=True)
