"""PLI as an observer: client selection (Eq. 11) and a real run on digits (work in progress toward issue 3)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fdattack.attacks.pli import select_reconstructions
from fdattack.config import compose
from fdattack.experiment import run
from tests.conftest import tiny


def test_selection_picks_the_distinct_clean_candidate() -> None:
    g = torch.Generator().manual_seed(0)
    generic = torch.rand(1, 1, 16, 16, generator=g) * 2 - 1
    owner = torch.rand(1, 1, 16, 16, generator=g) * 2 - 1
    candidates = torch.stack([generic, owner, generic.clone()])  # (K=3, T=1, C, H, W)
    assert select_reconstructions(candidates, beta=0.0).tolist() == [1]
    # a noisy candidate is even less similar to the others, but TV rejects it when beta is large enough
    noisy = (torch.rand(1, 1, 16, 16, generator=g) > 0.5).float() * 2 - 1
    smooth_owner = torch.full((1, 1, 16, 16), 0.3)
    candidates = torch.stack([generic, smooth_owner, generic.clone(), noisy])
    assert select_reconstructions(candidates, beta=0.0).tolist() == [3]
    assert select_reconstructions(candidates, beta=1.0).tolist() == [1]
    assert select_reconstructions(candidates[:1], beta=0.1).tolist() == [0]


def test_pli_runs_every_round_and_improves(tmp_path: Path) -> None:
    cfg = compose(None, tiny(tmp_path, "attacks=[pli]", "protocol.rounds=3", "attack.max_width=64", "attack.lr=1e-4",
                             "attack.epochs_per_round=2", "observers.confidence_gap.enabled=false"))
    metrics = run(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    ssim = [r["attack/pli/ssim"] for r in rows[1:]]
    assert len(ssim) == 3 and ssim[-1] > ssim[0]
    assert 0.0 <= metrics["attack/pli/accuracy"] <= 1.0 and metrics["attack/pli/chance"] == 0.2
    assert (tmp_path / "run" / "images" / "attack_pli_reconstructions_round_0003.png").is_file()
    from PIL import Image

    # one column per target: reconstruction, private mean, public mean (8x8 digits, 5 targets)
    assert Image.open(tmp_path / "run" / "images" / "attack_pli_reconstructions_round_0003.png").size == (5 * 8, 3 * 8)
    saved = torch.load(tmp_path / "run" / "artifacts" / "pli_reconstructions_round_0003.pt", weights_only=True)
    assert saved["images"].shape == (5, 1, 8, 8) and saved["labels"].shape == (5,)


def test_pli_beats_tbi_on_digits_with_fedmd(tmp_path: Path) -> None:
    """The paper's headline claim (pli.md §11.1) on the embedded data: TBI reproduces the public look."""
    cfg = compose(None, [f"output_dir={tmp_path / 'run'}", "logger.wandb.mode=disabled", "logger.progress=never",
                         "attacks=[pli,tbi]", "attack.max_width=128", "attack.lr=1e-4", "observers.confidence_gap.enabled=false"])
    metrics = run(cfg)
    assert metrics["attack/pli/accuracy"] > metrics["attack/tbi/accuracy"]
    assert metrics["attack/pli/accuracy"] > metrics["attack/pli/chance"]
    assert metrics["attack/tbi/too_close_to_public"] >= metrics["attack/pli/too_close_to_public"]
