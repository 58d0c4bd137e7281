"""Run one experiment under DDP and save this rank's weights and the rows it trained on (launched by test_ddp.py).

Fabric re-runs this file once per extra rank, so it must be a script, not a pytest function. Every training pass
(:meth:`LocalTrainer.fit_module`: the clients', the server's and the attacks' networks) is recorded as the model's
name, the size of its data and, per epoch, the rows that reached ``training_step`` on this rank.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from fdattack.config import compose
from fdattack.engine import LocalTrainer
from fdattack.experiment import Experiment

#: one entry per fit_module call: {"model": name, "n": rows in its data, "epochs": [rows of epoch 0, ...]}
FITS: list[dict[str, Any]] = []


class _Recorded:
    """``data`` as fit_module reads it (``len`` and ``batch(rows)``), noting the rows of every batch."""

    def __init__(self, data: Any, fit: dict[str, Any]) -> None:
        self.data, self.fit = data, fit

    def __len__(self) -> int:
        return len(self.data)

    def batch(self, rows: torch.Tensor) -> Any:
        if not self.fit["epochs"]:  # a sampler of a training defense drew the batches, not LocalTrainer._batches
            self.fit["epochs"].append([])
        self.fit["epochs"][-1].append(rows.clone())
        return self.data.batch(rows)


def _record() -> None:
    fit_module, batches = LocalTrainer.fit_module, LocalTrainer._batches

    def recording_fit(self: LocalTrainer, handle: Any, data: Any, epochs: int, seed: int, *args: Any, **kwargs: Any) -> Any:
        FITS.append({"model": handle.name, "n": len(data), "epochs": []})
        return fit_module(self, handle, _Recorded(data, FITS[-1]), epochs, seed, *args, **kwargs)

    def recording_batches(self: LocalTrainer, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        FITS[-1]["epochs"].append([])  # fit_module draws an epoch's batches before its first step
        return batches(self, *args, **kwargs)

    LocalTrainer.fit_module = recording_fit  # type: ignore[method-assign]
    LocalTrainer._batches = recording_batches  # type: ignore[method-assign]


if __name__ == "__main__":
    weights_dir = Path(sys.argv[1])
    _record()
    exp = Experiment(compose(None, sys.argv[2:]))
    exp.run()
    rank = exp.fabric.global_rank
    states = {f"client{k}": {n: t.detach().cpu() for n, t in c.module.state_dict().items()} for k, c in enumerate(exp.protocol.clients)}
    for attack in exp.attacks:  # the attacks' networks, trained sharded on both ranks
        state = attack.store.get(0)  # type: ignore[attr-defined]
        states[f"attack_{attack.name}"] = {n: t.detach().cpu() for n, t in state["model"].items()}
    if exp.protocol.server is not None:
        states["server"] = {n: t.detach().cpu() for n, t in exp.protocol.server.module.state_dict().items()}
    torch.save(states, weights_dir / f"rank{rank}.pt")
    fits = [{**fit, "epochs": [torch.cat(rows) if rows else torch.empty(0, dtype=torch.long) for rows in fit["epochs"]]} for fit in FITS]
    torch.save(fits, weights_dir / f"rank{rank}_rows.pt")
    print(f"worker rank {rank} world {exp.fabric.world_size} done")
