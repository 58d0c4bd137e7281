"""Shared fixtures: small real configs, data paths, and an environment where W&B can never go online."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny models: one thread is faster than two on a 2-core box

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _offline_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No credentials, no network for W&B, and nothing written outside tmp_path."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    netrc = tmp_path / "netrc"
    netrc.write_text("")
    monkeypatch.setenv("NETRC", str(netrc))


def tiny(tmp_path: Path, *extra: str) -> list[str]:
    """Overrides that shrink any experiment to seconds: 2 clients, 2 rounds, few epochs, W&B off."""
    return [
        f"output_dir={tmp_path / 'run'}",
        "logger.wandb.mode=disabled",
        "logger.progress=never",
        "protocol.num_clients=2",
        "protocol.rounds=2",
        "attacks=[]",
        *extra,
    ]
