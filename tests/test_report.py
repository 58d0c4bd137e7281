"""``fdattack report`` writes the offline dashboard from run directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torchvision.utils import save_image

from fdattack.cli import main
from fdattack.tracking import attack_summary


def _fake_run(path: Path, name: str, accuracies: list[float]) -> None:
    (path / "images").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create({"name": name, "protocol": {"name": "fedmd"}}), path / "config.yaml")
    rows = [{"round": r + 1, "attack/pli/accuracy": a, "attack/tbi/accuracy": a / 2} for r, a in enumerate(accuracies)]
    (path / "rounds.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (path / "metrics.json").write_text(json.dumps({"attack/pli/accuracy": accuracies[-1], "protocol/client_acc_mean": 0.9}))
    save_image(torch.rand(1, 24, 40), path / "images" / f"attack_pli_reconstructions_round_{len(accuracies):04d}.png")


def test_report_has_plots_table_and_last_grids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fake_run(tmp_path / "a", "exp_a", [0.1, 0.3, 0.5])
    _fake_run(tmp_path / "b", "exp_b", [0.2, 0.25])
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert (tmp_path / "report" / "plot_accuracy.png").is_file()
    assert "exp_a [fedmd]" in page and "exp_b [fedmd]" in page and "<td>0.5</td>" in page
    assert (tmp_path / "report" / "run0_attack_pli_reconstructions_round_0003.png").is_file()
    assert (tmp_path / "report" / "run1_attack_pli_reconstructions_round_0002.png").is_file()


def test_report_on_a_non_run_folder_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    assert "rounds.jsonl" in capsys.readouterr().err


def test_attack_summary_has_a_row_per_attack_with_its_final_scores() -> None:
    final = {"attack/tbi/accuracy": 0.25, "attack/pli/accuracy": 0.8, "attack/pli/ssim": 0.7123, "attack/pli/chance": 0.2,
             "attack/pli/too_close_to_public": 1.0, "protocol/client_acc_mean": 0.9, "attack/pli/prior/extra": 1.0}
    lines = attack_summary(final).splitlines()
    assert lines[0].split()[:3] == ["attack", "accuracy", "SSIM"]
    assert lines[1].split() == ["pli", "0.80", "0.712", "1", "-", "0.20"]
    assert lines[2].split() == ["tbi", "0.25", "-", "-", "-", "-"]
    assert len({len(line) for line in lines}) == 1  # columns line up
    assert attack_summary({"protocol/client_acc_mean": 0.9}) == ""
