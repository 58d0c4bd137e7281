"""Run one experiment under DDP and save this rank's client weights (launched by test_ddp.py).

Fabric re-runs this file once per extra rank, so it must be a script, not a pytest function.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from fdattack.config import compose
from fdattack.experiment import Experiment

if __name__ == "__main__":
    weights_dir = Path(sys.argv[1])
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
    print(f"worker rank {rank} world {exp.fabric.world_size} done")
