"""Uploads with NaN/inf are refused naming client and round, or dropped and recorded when configured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fdattack.cli import main
from fdattack.config import compose
from fdattack.errors import UploadError
from fdattack.experiment import Experiment
from tests.conftest import tiny


def _poison_client(exp: Experiment, k: int) -> None:
    with torch.no_grad():
        next(exp.protocol.clients[k].module.net.parameters()).fill_(float("nan"))


def test_nan_upload_is_refused_naming_client_and_round(tmp_path: Path) -> None:
    exp = Experiment(
        compose(None, tiny(tmp_path, "protocol.num_clients=3", "protocol.transfer_public_epochs=0", "protocol.transfer_private_epochs=0"))
    )
    _poison_client(exp, 1)
    with pytest.raises(UploadError, match=r"client 1 .*round 1"):
        exp.run()


def test_nan_upload_dropped_when_configured(tmp_path: Path) -> None:
    exp = Experiment(
        compose(
            None,
            tiny(
                tmp_path,
                "protocol.num_clients=3",
                "protocol.on_bad_upload=drop",
                "protocol.transfer_public_epochs=0",
                "protocol.transfer_private_epochs=0",
            ),
        )
    )
    _poison_client(exp, 1)
    metrics = exp.run()
    assert metrics["protocol/dropped_uploads"] == 1.0
    rows = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert [r.get("protocol/dropped_uploads") for r in rows[1:]] == [1.0, 1.0]
    # the consensus of the healthy clients stayed finite, so they still learn
    assert all(torch.isfinite(p).all() for p in exp.protocol.clients[0].module.parameters())


def test_cli_turns_nan_upload_into_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a learning rate this large makes the logits overflow to inf/NaN during transfer learning
    code = main(["run", *tiny(tmp_path, "protocol.optim.lr=1e30", "protocol.optim.name=sgd")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "uploaded NaN/inf" in err and "round 1" in err
