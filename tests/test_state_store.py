"""ClientStateStore: rounds become visible whole, checkpoints pin their round, bad files give a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fdattack.attacks.state_store import ClientStateStore
from fdattack.errors import CheckpointError


@pytest.mark.parametrize("on_disk", [False, True])
def test_rounds_become_visible_only_when_finished(tmp_path: Path, on_disk: bool) -> None:
    store = ClientStateStore(tmp_path / "s" if on_disk else None)
    assert store.get(0) is None
    store.put(1, 0, {"w": torch.tensor([1.0])})
    assert store.get(0) is None  # round 1 not finished yet
    store.finish_round(1)
    store.put(2, 0, {"w": torch.tensor([2.0])})
    assert store.get(0)["w"].item() == 1.0  # a half-done round 2 does not leak
    store.finish_round(2)
    assert store.get(0)["w"].item() == 2.0 and store.get(1) is None


def test_checkpoint_pins_its_round_and_old_rounds_are_deleted(tmp_path: Path) -> None:
    tmp_path = tmp_path / "store"
    store = ClientStateStore(tmp_path)
    for r in (1, 2):
        store.put(r, 0, {"w": torch.tensor([float(r)])})
        store.finish_round(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round_0002"]
    checkpoint = store.state_dict()
    for r in (3, 4):
        store.put(r, 0, {"w": torch.tensor([float(r)])})
        store.finish_round(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round_0002", "round_0004"]
    resumed = ClientStateStore(tmp_path)
    resumed.load_state_dict(checkpoint)
    assert resumed.get(0)["w"].item() == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round_0002"]


def test_memory_store_checkpoints_carry_the_states() -> None:
    store = ClientStateStore()
    store.put(1, 3, {"w": torch.tensor([5.0])})
    store.finish_round(1)
    resumed = ClientStateStore()
    resumed.load_state_dict(store.state_dict())
    assert resumed.get(3)["w"].item() == 5.0


def test_missing_or_corrupt_state_is_a_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="round 7"):
        ClientStateStore(tmp_path).load_state_dict({"round": 7})
    store = ClientStateStore(tmp_path)
    store.put(1, 0, {"w": torch.tensor([1.0])})
    store.finish_round(1)
    (tmp_path / "round_0001" / "client_0.pt").write_bytes(b"not a tensor file")
    with pytest.raises(CheckpointError, match="unreadable"):
        store.get(0)


def test_every_kept_checkpoint_keeps_its_round_and_a_later_round_is_dropped_on_resume(tmp_path: Path) -> None:
    tmp_path = tmp_path / "store"
    store = ClientStateStore(tmp_path, keep=2)
    checkpoints = {}
    for r in range(1, 5):
        store.put(r, 0, {"w": torch.tensor([float(r)])})
        store.finish_round(r)
        checkpoints[r] = store.state_dict()  # a run checkpoint after every round, keep_checkpoints=2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round_0003", "round_0004"]
    resumed = ClientStateStore(tmp_path, keep=2)
    resumed.load_state_dict(checkpoints[3])  # the newest checkpoint (round 4) was deleted
    assert resumed.get(0)["w"].item() == 3.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round_0003"]
    resumed.put(4, 0, {"w": torch.tensor([4.5])})
    resumed.finish_round(4)
    resumed.state_dict()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round_0003", "round_0004"]
