"""Small fake run directories for the report tests: what a sweep over PLI's tau and gamma leaves behind."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torchvision.utils import save_image

from fdattack.tracking import save_checkpoint

TARGETS = [5, 6, 7, 8, 9]


def _grid(targets: int, side: int, seed: int) -> torch.Tensor:
    """A (1, T*side, 3*side) grid: a noisy reconstruction, a private mean and a public mean per row."""
    g = torch.Generator().manual_seed(seed)
    ramp = torch.linspace(0, 1, side)
    rows = [torch.cat([torch.rand(side, side, generator=g), ramp.outer(ramp), ramp.flip(0).outer(ramp)], dim=1) for _ in range(targets)]
    return torch.cat(rows).unsqueeze(0)


def fake_run(path: Path, tau: float, gamma: float, rounds: int = 3, seed: int = 0) -> Path:
    """A run of ``rounds`` rounds: protocol metrics from round 0 (transfer losses only there), PLI and TBI
    scores from round 1 (PLI's prior scores only there), grids and PLI's reconstruction artifacts."""
    (path / "images").mkdir(parents=True)
    (path / "artifacts").mkdir()
    config = {
        "name": f"trial_{seed:03d}",
        "seed": 42,
        "output_dir": str(path),
        "resume": False,
        "logger": {"wandb": {"name": f"trial_{seed:03d}"}},
        "data": {"name": "digits", "image_size": None},
        "protocol": {"name": "fedmd", "rounds": rounds},
        "attacks": ["pli", "tbi"],
        "attack": {"pli": {"tau": tau, "gamma": gamma}, "tbi": {"lr": 3e-5}},
    }
    OmegaConf.save(OmegaConf.create(config), path / "config.yaml")
    rows = [{"round": 0, "protocol/client_acc_mean": 0.5, "protocol/transfer_public_loss": 1.8}]
    for r in range(1, rounds + 1):
        acc = min(1.0, 0.2 + 0.15 * r * tau * (1 - gamma))
        row = {
            "round": r,
            "protocol/client_acc_mean": 0.5 + 0.1 * r,
            "attack/pli/accuracy": acc,
            "attack/pli/ssim": 0.3 + 0.1 * r,
            "attack/pli/chance": 0.2,
            "attack/pli/eval_top1": acc / 2,
            "attack/tbi/accuracy": 0.2,
            "attack/tbi/chance": 0.2,
        }
        if r == 1:
            row.update({"attack/pli/prior_accuracy": 0.6, "attack/pli/prior_ssim": 0.45})
        rows.append(row)
        save_image(_grid(len(TARGETS), 8, seed * 10 + r), path / "images" / f"attack_pli_reconstructions_round_{r:04d}.png")
        save_checkpoint(
            path / "artifacts" / f"pli_reconstructions_round_{r:04d}.pt",
            {"images": torch.zeros(len(TARGETS), 1, 8, 8), "labels": torch.tensor(TARGETS)},
        )
    save_image(_grid(len(TARGETS), 8, 99), path / "images" / "attack_pli_prior_round_0001.png")
    save_image(_grid(len(TARGETS), 8, 98), path / "images" / f"attack_tbi_reconstructions_round_{rounds:04d}.png")
    (path / "rounds.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    final = {k: v for k, v in rows[-1].items() if k != "round"}
    (path / "metrics.json").write_text(json.dumps({**final, "time/total_s": 12.5}))
    return path
