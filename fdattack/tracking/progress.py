"""What the run is doing now, on the terminal, from its first second to its last round.

:class:`Progress` is a bar over communication rounds whose postfix names the activity running now: the
set-up steps (loading data, training the evaluation classifier), each protocol phase, and each attack
by name while it trains and is scored. Each attack's score is printed as a line above the bar as soon
as its round is scored. ``mode`` is ``auto`` (a bar only when stderr is a terminal), ``always`` or
``never``; without a bar the set-up steps and the scores go to the ``fdattack`` logger at INFO, so a
batch job's log shows them too, and phases (many per round) go to DEBUG.
"""

from __future__ import annotations

import logging
import math
import sys
from types import TracebackType
from typing import Iterable, Iterator, Mapping, TypeVar

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

T = TypeVar("T")
PROGRESS_MODES = ("auto", "always", "never")
log = logging.getLogger("fdattack")

#: (metric suffix under ``attack/<name>/``, label, format) of the score line printed after each round
SCORE_COLUMNS = (
    ("accuracy", "accuracy", "{:.2f}"),
    ("ssim", "SSIM", "{:.3f}"),
    ("eval_top1", "eval top-1", "{:.2f}"),
    ("top1", "top-1", "{:.2f}"),
    ("chance", "chance", "{:.2f}"),
    ("top5", "top-5", "{:.2f}"),
    ("fid", "FID", "{:.1f}"),
    ("kl", "KL", "{:.3f}"),
    ("random_kl", "random KL", "{:.3f}"),
    ("tpr_at_1pct_fpr", "TPR@1%FPR", "{:.2%}"),
    ("auc", "AUC", "{:.3f}"),
)


def progress_shown(mode: str) -> bool:
    """Whether a bar is drawn for ``mode`` (``auto``: only when stderr is a TTY)."""
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress mode {mode!r} is not one of {' | '.join(PROGRESS_MODES)}")
    return mode == "always" or (mode == "auto" and sys.stderr.isatty())


def score_line(round: int, attack: str, metrics: Mapping[str, float]) -> str | None:
    """``round 3  pli: accuracy 0.40  SSIM 0.380  eval top-1 0.60  chance 0.20`` from a round's metrics; None if it has none."""
    cells = []
    for suffix, label, fmt in SCORE_COLUMNS:
        value = metrics.get(f"attack/{attack}/{suffix}")
        if isinstance(value, (int, float)):
            cells.append(f"{label} {'nan' if math.isnan(value) else fmt.format(value)}")
    return f"round {round}  {attack}: " + "  ".join(cells) if cells else None


class Progress:
    """A bar over communication rounds whose postfix names the activity running now.

    Args:
        mode: ``auto`` | ``always`` | ``never``.
        total_rounds: the last round index T.
        start_round: rounds already done (a resumed run starts its bar there).
    """

    def __init__(self, mode: str, total_rounds: int, start_round: int = 0) -> None:
        self._bar = (
            tqdm(total=total_rounds, initial=start_round, desc="rounds", unit="round", file=sys.stderr, dynamic_ncols=True)
            if progress_shown(mode)
            else None
        )
        # log lines above the bar, not through it (fdattack's own handler: tracking/logs.py; and the root's, for others)
        self._logging = logging_redirect_tqdm(loggers=[logging.root, log]) if self._bar is not None else None
        if self._logging is not None:
            self._logging.__enter__()

    def activity(self, text: str) -> None:
        """Show ``text`` as what runs now (a set-up step, an attack); logged at INFO when there is no bar."""
        if self._bar is not None:
            self._bar.set_postfix_str(text)
        else:
            log.info("%s", text)

    def phase(self, round: int, name: str) -> None:
        """Show the protocol phase ``name`` of ``round`` as what runs now (DEBUG when there is no bar: there are many a round)."""
        if self._bar is not None:
            self._bar.set_postfix_str(f"round {round}: phase {name}")
        else:
            log.debug("round %d: phase %s", round, name)

    def scores(self, round: int, attack: str, metrics: Mapping[str, float]) -> None:
        """Print an attack's scores of ``round`` above the bar (or log them) as soon as they are known."""
        line = score_line(round, attack, metrics)
        if line is None:
            return
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            log.info("%s", line)

    def skip_to(self, round: int) -> None:
        """Count the rounds up to ``round`` as done (a resumed run)."""
        if self._bar is not None:
            self._bar.n = round
            self._bar.refresh()

    def advance(self) -> None:
        """Count one finished round."""
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        """Remove the bar (idempotent)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._logging is not None:
            self._logging.__exit__(None, None, None)
            self._logging = None

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
