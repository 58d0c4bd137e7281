"""A plugin's attack in the run's process, whose failure costs that attack alone.

With ``isolation.mode=in_process`` an attack that a plugin registered (a module of ``plugins`` or an installed entry
point, :func:`fdattack.plugins.plugin_components`) runs wrapped in a :class:`GuardedAttack`. An exception from its
construction, its hooks (``on_record``, ``on_round_end``), its results' scoring or its state stops it as an isolated
worker's failure does (:mod:`fdattack.isolation.proxy`): one line in the log, its traceback in
``attack_state/<name>.log``, ``attack/<name>/stopped/failed`` = 1 from that round on, no final score
(:mod:`fdattack.tracking.stopped_attacks`), and ``fdattack run`` exits with status 3. fdattack's own attacks are not
wrapped: an error of theirs is fdattack's bug, and ends the run with its traceback.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from fdattack.isolation.processes import bounded_line

log = logging.getLogger("fdattack")


class GuardedAttack:
    """The calls the run makes on an in-process attack, each stopping it for good on an exception.

    Args:
        name: the attack's name.
        build: makes the attack (its construction may fail too).
        log_path: where its traceback goes (None: nowhere but the one line).
    """

    def __init__(self, name: str, build: Callable[[], Any], log_path: Optional[Path]) -> None:
        self.name = name
        self.log_path = log_path
        self.stopped: Optional[tuple[str, str]] = None  # ("failed", the one line), as an isolated worker's
        self.attack: Any = None
        self.attack = self.guarded("could not be built", build)

    @property
    def alive(self) -> bool:
        return self.stopped is None

    def guarded(self, doing: str, call: Callable[[], Any], default: Any = None) -> Any:
        """``call()``, or ``default`` once the attack is stopped or where the call raises (which stops it)."""
        if not self.alive:
            return default
        try:
            return call()
        except Exception as err:  # noqa: BLE001 - whatever a plugin's code raises costs that attack only
            self.stop(f"it {doing} ({type(err).__name__}: {err})", traceback.format_exc())
            return default

    def stop(self, line: str, details: str = "") -> None:
        """Stop the attack for good: the run goes on without it."""
        self.stopped = ("failed", bounded_line(line))
        self.attack = None
        where = ""
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a", encoding="utf-8") as out:
                out.write(f"attack {self.name} stopped: {self.stopped[1]}\n{details}\n")
            where = f" (its traceback: {self.log_path})"
        log.warning("attack %s stopped: %s; the run goes on without it%s", self.name, self.stopped[1], where)

    def stopped_metrics(self) -> dict[str, float]:
        """``attack/<name>/stopped/failed`` = 1 once it was stopped; {} while it runs."""
        return {} if self.stopped is None else {f"attack/{self.name}/stopped/{self.stopped[0]}": 1.0}

    # ------------------------------------------------------------------ the hooks the orchestrator calls
    def on_record(self, record: Any) -> None:
        self.guarded("failed on a round record", lambda: self.attack.on_record(record))

    def on_round_end(self, round: int) -> list:
        """The attack's results of ``round``; [] once stopped, or where it returns something other than a list."""

        def results() -> list:
            returned = self.attack.on_round_end(round)
            if type(returned) is not list and type(returned) is not tuple:
                raise TypeError(f"on_round_end returned a {type(returned).__name__}; it must return a list")
            return list(returned)

        return self.guarded(f"failed at the end of round {round}", results, [])

    # ------------------------------------------------------------------ its state in the run's checkpoints
    def state_dict(self) -> dict:
        """The attack's state, or that it was stopped (which a resumed run keeps)."""
        state = self.guarded("failed to give its state", lambda: self.attack.state_dict(), {})
        return state if self.stopped is None else {"guarded": {"stopped": list(self.stopped)}}

    def load_state_dict(self, saved: dict) -> None:
        """Restore the attack, or keep it stopped where the checkpoint says it was."""
        stopped = saved.get("guarded", {}).get("stopped") if type(saved) is dict else None
        if stopped is not None:
            self.stopped, self.attack = (str(stopped[0]), str(stopped[1])), None
            return
        self.guarded("failed to load its state", lambda: self.attack.load_state_dict(saved))
