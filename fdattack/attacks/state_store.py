"""Where an attack keeps its per-client training state between rounds (model and optimizer state dicts).

PLI trains one inversion network per client; keeping K of them resident would make memory grow with K
(one 64x64 network with Adam state is about 0.5 GB). A store on disk keeps only the network being
trained in memory. States are written per round (``round_XXXX/client_K.pt``) and a round becomes the
current one only when every client is done, so a run killed mid-round resumes from whole rounds. The
rounds named by the last ``keep`` run checkpoints (``keep_checkpoints``) stay on disk, so a run can
resume from any checkpoint that is kept, not only the newest. Named artifacts (distilled students, trained GANs) are
kept beside them by key (:meth:`ClientStateStore.save_artifact`).

The store's folder sits inside the run directory, next to the ground truth (``partition.json``, checkpoints, the
evaluation classifier). An attack holds the store, so the store holds no path: its folder waits in this module's
table behind a random token, and keys cannot climb out of it (issue 28).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import weakref
from pathlib import Path
from typing import Any, Optional

import torch

from fdattack.errors import CheckpointError

#: the stores' folders, by token
_FOLDERS: dict[int, Path] = {}
#: one segment of an artifact key: no separators, no leading dot (so no ``..``)
_KEY_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


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
        self._token: Optional[int] = None
        if directory is not None:
            self._token = secrets.randbits(64)
            _FOLDERS[self._token] = Path(directory)
            weakref.finalize(self, _FOLDERS.pop, self._token, None)
        self.keep = keep
        self.current: Optional[int] = None  # round whose states are read
        self.pinned: list[Optional[int]] = []  # rounds named by the last `keep` checkpoints, oldest first
        self._memory: dict[int, dict[int, dict]] = {}

    @property
    def on_disk(self) -> bool:
        """Whether the states and artifacts outlive the process (a run directory), or live in memory (no artifacts)."""
        return self._token is not None

    @property
    def _directory(self) -> Optional[Path]:
        return None if self._token is None else _FOLDERS[self._token]

    def _path(self, round: int, client: int) -> Path:
        assert self._directory is not None
        return self._directory / f"round_{round:04d}" / f"client_{client}.pt"

    def _artifact_path(self, key: str) -> Path:
        segments = key.split("/")
        if not all(_KEY_SEGMENT.fullmatch(segment) for segment in segments):
            raise ValueError(
                f"artifact key {key!r}: use '/'-separated names of letters, digits, '_', '.' and '-' that start with a letter, digit or '_'"
            )
        assert self._directory is not None
        return self._directory.joinpath(*segments).with_suffix(".pt")

    def load_artifact(self, key: str) -> Optional[Any]:
        """The artifact saved under ``key`` (tensors, dicts and lists of them), or None when none is (or in memory)."""
        if not self.on_disk:
            return None
        path = self._artifact_path(key)
        if not path.is_file():
            return None
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is the same error to the user
            raise CheckpointError(f"attack artifact {path} is unreadable ({type(exc).__name__}); delete it or the run") from exc

    def save_artifact(self, key: str, value: Any) -> None:
        """Keep ``value`` under ``key`` for a resumed run (atomically; nothing in memory: an artifact is a resume cache)."""
        if not self.on_disk:
            return
        path = self._artifact_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(value, tmp)
        os.replace(tmp, path)

    def get(self, client: int) -> Optional[dict]:
        """The client's state at the end of the current round, or None before its first round."""
        if self.current is None:
            return None
        if not self.on_disk:
            return self._memory.get(self.current, {}).get(client)
        path = self._path(self.current, client)
        if not path.is_file():
            return None
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is the same error to the user
            raise CheckpointError(
                f"attack state {path} is unreadable ({type(exc).__name__}); delete the run or resume from scratch"
            ) from exc

    def put(self, round: int, client: int, state: dict) -> None:
        """Store the client's state after ``round`` (visible once :meth:`finish_round` is called)."""
        if not self.on_disk:
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
        directory = self._directory
        if directory is None:
            return list(self._memory)
        if not directory.is_dir():
            return []
        return [int(p.name.split("_")[1]) for p in directory.glob("round_*") if p.is_dir()]

    def _prune(self) -> None:
        """Keep the current round, and on disk the pinned ones (a memory store's checkpoints hold their states)."""
        directory = self._directory
        kept = {self.current, *(self.pinned if directory is not None else ())}
        for r in self._rounds():
            if r not in kept:
                if directory is None:
                    del self._memory[r]
                else:
                    shutil.rmtree(directory / f"round_{r:04d}", ignore_errors=True)

    def state_dict(self) -> dict:
        """What a run checkpoint records; pins the current round's files for this and the next ``keep - 1`` checkpoints."""
        self.pinned = [*self.pinned, self.current][-self.keep :]
        self._prune()
        state: dict = {"round": self.current, "pinned": list(self.pinned)}
        if not self.on_disk and self.current is not None:
            state["states"] = {str(k): v for k, v in self._memory[self.current].items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint: its round becomes current; rounds after it (a newer, deleted checkpoint's) are dropped."""
        self.current = state.get("round")
        self.pinned = list(state.get("pinned", [self.current]))[-self.keep :]
        if "states" in state:
            self._memory = {self.current: {int(k): v for k, v in state["states"].items()}}
        elif self.current is not None and (self._directory is None or not (self._directory / f"round_{self.current:04d}").is_dir()):
            raise CheckpointError(
                f"the checkpoint needs the attack states of round {self.current} under {self._directory}, which are missing"
            )
        self._prune()
