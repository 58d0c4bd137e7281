"""One FedMD round with 2 CPU processes under DDP (gloo): ranks agree on the clients, the server and the attack's
network (attack training is sharded, not repeated), and only rank 0 writes and logs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO


@pytest.mark.slow
def test_two_process_ddp_round(tmp_path: Path) -> None:
    out = tmp_path / "run"
    weights = tmp_path / "weights"
    weights.mkdir()
    cmd = [
        sys.executable, str(REPO / "tests" / "ddp_worker.py"), str(weights),
        f"output_dir={out}", "trainer.strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu",
        "protocol.rounds=1", "protocol.num_clients=2", "protocol.transfer_public_epochs=1", "protocol.transfer_private_epochs=1",
        "logger.wandb.mode=offline", "logger.progress=never", "attacks=[tbi]", "attack.tbi.max_width=16", "attack.tbi.epochs_per_round=2",
        "evaluation.classifier=null", "observers.confidence_gap.enabled=false",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "world 2 done" in proc.stdout
    rank0 = torch.load(weights / "rank0.pt", weights_only=True)
    rank1 = torch.load(weights / "rank1.pt", weights_only=True)
    assert rank0.keys() == rank1.keys() and "attack_tbi" in rank0
    for model in rank0:
        for name in rank0[model]:
            torch.testing.assert_close(rank0[model][name], rank1[model][name], rtol=0, atol=1e-6, msg=f"{model}.{name}")
    # only rank 0 wrote the run directory and logged
    assert proc.stdout.count("fdattack: results in") == 1
    assert len(list((out / "wandb").glob("offline-run-*"))) == 1
    assert (out / "rounds.jsonl").read_text().count("\n") == 2
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["round_0000.pt", "round_0001.pt"]
