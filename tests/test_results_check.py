"""The one check behind every result read back from disk (:mod:`fdattack.tracking.results`): seed replicas, matrix
simulations, sweep trials and resumed runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fdattack.config import compose
from fdattack.errors import CheckpointError, DataError
from fdattack.tracking.results import check_made_with, read_result, result_tree
from tests.conftest import tiny

ONE_ROUND = ("protocol.rounds=1", "attacks=[public_mean]", "evaluation.classifier=null", "evaluation.confidence_gap.enabled=false")


def test_the_shared_check_compares_every_result_deciding_key_and_no_logger_key(tmp_path: Path) -> None:
    cfg = compose(None, tiny(tmp_path, *ONE_ROUND))
    folder = tmp_path / "made"
    folder.mkdir()
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (folder / "metrics.json").write_text(json.dumps({"attack/public_mean/ssim": 0.5, "protocol/client_acc_mean": None}))
    cached = f"cache_dir={tmp_path / 'cache'}"  # a cached network is the one the run would train
    moved = compose(None, tiny(tmp_path / "elsewhere", *ONE_ROUND, "logger.wandb.group=other", "logger.level=DEBUG", cached))
    expected = {"attack/public_mean/ssim": 0.5, "protocol/client_acc_mean": float("nan")}
    assert read_result(folder, moved) == pytest.approx(expected, nan_ok=True)
    assert not {"logger", "output_dir", "cache_dir"} & set(result_tree(cfg))
    with pytest.raises(CheckpointError, match=r"protocol\.rounds \(stored 1, given 2\)"):
        check_made_with(folder, compose(None, tiny(tmp_path, *ONE_ROUND, "protocol.rounds=2")))
    (folder / "metrics.json").write_text(json.dumps({"attack/public_mean/ssim": "0.5"}))
    with pytest.raises(DataError, match="attack/public_mean/ssim"):
        read_result(folder, cfg)
    (folder / "config.yaml").unlink()
    with pytest.raises(CheckpointError, match="config.yaml: missing"):
        read_result(folder, cfg)
