"""Where an attack keeps its per-client training state between rounds (model and optimizer state dicts).

PLI trains one inversion network per client; keeping K of them resident would make memory grow with K
(one 64x64 network with Adam state is about 0.5 GB). A store on disk keeps only the network being
trained in memory. States are written per round (``round_XXXX/client_K.pt``) and a round becomes the
current one only when every client is done, so a run killed mid-round resumes from whole rounds. The
rounds named by the last ``keep`` run checkpoints (``keep_checkpoints``) stay on disk, so a run can
resume from any checkpoint that is kept, not only the newest.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

import torch

from fdattack.errors import CheckpointError


class ClientStateStore:
    """Per-client state dicts, on disk under ``directory`` or in memory when it is None.

    Args:
        directory: folder of the round subfolders (created on the first write), or None for memory
            (a checkpoint then carries the states themselves).
        keep: how many run checkpoints keep their round's states on disk (the run's ``keep_checkpoints``).
    """

    def __init__(self, directory: Optional[Path] = None, keep: int = 1) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = directory
        self.keep = keep
        self.current: Optional[int] = None  # round whose states are read
        self.pinned: list[Optional[int]] = []  # rounds named by the last `keep` checkpoints, oldest first
        self._memory: dict[int, dict[int, dict]] = {}

    def _path(self, round: int, client: int) -> Path:
        assert self.directory is not None
        return self.directory / f"round_{round:04d}" / f"client_{client}.pt"

    def get(self, client: int) -> Optional[dict]:
        """The client's state at the end of the current round, or None before its first round."""
        if self.current is None:
            return None
        if self.directory is None:
            return self._memory.get(self.current, {}).get(client)
        path = self._path(self.current, client)
        if not path.is_file():
            return None
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is the same error to the user
            raise CheckpointError(f"attack state {path} is unreadable ({type(exc).__name__}); delete the run or resume from scratch") from exc

    def put(self, round: int, client: int, state: dict) -> None:
        """Store the client's state after ``round`` (visible once :meth:`finish_round` is called)."""
        if self.directory is None:
            self._memory.setdefault(round, {})[client] = state
            return
        path = self._path(round, client)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)

    def finish_round(self, round: int) -> None:
        """Make ``round`` current and drop rounds neither current nor pinned."""
        self.current = round
        self._prune()

    def _rounds(self) -> list[int]:
        if self.directory is None:
            return list(self._memory)
        if not self.directory.is_dir():
            return []
        return [int(p.name.split("_")[1]) for p in self.directory.glob("round_*") if p.is_dir()]

    def _prune(self) -> None:
        """Keep the current round, and on disk the pinned ones (a memory store's checkpoints hold their states)."""
        kept = {self.current, *(self.pinned if self.directory is not None else ())}
        for r in self._rounds():
            if r not in kept:
                if self.directory is None:
                    del self._memory[r]
                else:
                    shutil.rmtree(self.directory / f"round_{r:04d}", ignore_errors=True)

    def state_dict(self) -> dict:
        """What a run checkpoint records; pins the current round's files for this and the next ``keep - 1`` checkpoints."""
        self.pinned = [*self.pinned, self.current][-self.keep:]
        self._prune()
        state: dict = {"round": self.current, "pinned": list(self.pinned)}
        if self.directory is None and self.current is not None:
            state["states"] = {str(k): v for k, v in self._memory[self.current].items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint: its round becomes current; rounds after it (a newer, deleted checkpoint's) are dropped."""
        self.current = state.get("round")
        self.pinned = list(state.get("pinned", [self.current]))[-self.keep:]
        if "states" in state:
            self._memory = {self.current: {int(k): v for k, v in state["states"].items()}}
        elif self.current is not None and (self.directory is None or not (self.directory / f"round_{self.current:04d}").is_dir()):
            raise CheckpointError(f"the checkpoint needs the attack states of round {self.current} under {self.directory}, which are missing")
        self._prune()
