"""One FedMD round with 2 CPU processes under DDP (gloo): each rank trains on its own half of every epoch's rows (the
clients', the server's and the attack's training: sharded, not repeated), the ranks agree on the weights, and only
rank 0 writes and logs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO


def _assert_sharded(fits0: list[dict], fits1: list[dict]) -> None:
    """Every training pass: in every epoch the two ranks saw disjoint halves of the rows that together cover them all.

    Equal weights alone cannot tell this from both ranks training on every row (the all-reduced mean of two equal
    gradients is that gradient): here a repeated batch fails. The one row two ranks may share is the padding of an
    odd number of rows (each rank takes ceil(n / 2) rows so that neither waits for the other)."""
    assert [(f["model"], f["n"], len(f["epochs"])) for f in fits0] == [(f["model"], f["n"], len(f["epochs"])) for f in fits1]
    models = {f["model"] for f in fits0 if f["epochs"]}
    assert "tbi_0" in models and len(models) >= 3, models  # the attack's network, the clients and the server
    for fit0, fit1 in zip(fits0, fits1):
        n = fit0["n"]
        for rows0, rows1 in zip(fit0["epochs"], fit1["epochs"]):
            a, b = set(rows0.tolist()), set(rows1.tolist())
            assert len(rows0) == len(a) and len(rows1) == len(b), f"{fit0['model']}: a rank saw a row twice in one epoch"
            assert len(rows0) == len(rows1) == -(-n // 2), fit0["model"]
            assert a | b == set(range(n)), f"{fit0['model']}: the ranks left rows out"
            assert len(a & b) == n % 2, f"{fit0['model']}: the ranks share {len(a & b)} of {n} rows: repeated, not sharded"


@pytest.mark.slow
def test_two_process_ddp_round(tmp_path: Path) -> None:
    out = tmp_path / "run"
    weights = tmp_path / "weights"
    weights.mkdir()
    cmd = [
        sys.executable,
        str(REPO / "tests" / "ddp_worker.py"),
        str(weights),
        f"output_dir={out}",
        "trainer.strategy=ddp",
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        "protocol.rounds=1",
        "protocol.num_clients=2",
        "protocol.transfer_public_epochs=1",
        "protocol.transfer_private_epochs=1",
        "logger.wandb.mode=offline",
        "logger.progress=never",
        "attacks=[tbi]",
        "attack.tbi.max_width=16",
        "attack.tbi.epochs_per_round=2",
        "evaluation.classifier=null",
        "evaluation.confidence_gap.enabled=false",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "world 2 done" in proc.stdout
    _assert_sharded(torch.load(weights / "rank0_rows.pt", weights_only=True), torch.load(weights / "rank1_rows.pt", weights_only=True))
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
