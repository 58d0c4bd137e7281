"""The content-addressed cache of networks that depend on no cell (fdattack/tracking/artifact_cache.py): named by all they
depend on, made once, read back, remade when unreadable, and made once when two processes ask at the same time."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from fdattack.tracking.artifact_cache import ArtifactCache, digest


@dataclass
class Knobs:
    epochs: int
    lr: float


def test_the_digest_names_every_input_and_nothing_else() -> None:
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    base = digest(Knobs(3, 0.1), 7, x, {"a": 1, "b": [2, 3]})
    assert digest(Knobs(3, 0.1), 7, x.clone(), {"b": [2, 3], "a": 1}) == base  # equal values, another dict order
    y = x.clone()
    y[2, 3] = 11.5
    assert digest(Knobs(3, 0.1), 7, y, {"a": 1, "b": [2, 3]}) != base  # one pixel
    assert digest(Knobs(3, 0.1), 7, x.double(), {"a": 1, "b": [2, 3]}) != base  # the dtype
    assert digest(Knobs(3, 0.1), 7, x.reshape(4, 3), {"a": 1, "b": [2, 3]}) != base  # the shape
    assert digest(Knobs(4, 0.1), 7, x, {"a": 1, "b": [2, 3]}) != base  # a setting
    assert digest(Knobs(3, 0.1), 8, x, {"a": 1, "b": [2, 3]}) != base  # the seed
    assert digest(Knobs(3, 0.1), 7, x, {"a": 1, "b": (2, 3)}) != base  # a tuple is not a list
    assert digest("7") != digest(7)


def _maker(calls: list[int], value: float = 1.0, seconds: float = 0.0):  # type: ignore[no-untyped-def]
    def make() -> dict:
        calls.append(1)
        time.sleep(seconds)
        return {"net": {"w": torch.full((2, 2), value)}, "note": "trained"}

    return make


def test_an_entry_is_made_once_and_read_back_by_later_fetches(tmp_path: Path) -> None:
    cache, calls = ArtifactCache(tmp_path / "cache", "in_process"), []
    first = cache.fetch("prior", "k1", _maker(calls))
    again = ArtifactCache(tmp_path / "cache", "in_process").fetch("prior", "k1", _maker(calls, value=2.0))
    assert calls == [1] and torch.equal(again["net"]["w"], first["net"]["w"]) and again["note"] == "trained"
    other = cache.fetch("prior", "k2", _maker(calls, value=3.0))  # another key is another entry
    assert calls == [1, 1] and float(other["net"]["w"][0, 0]) == 3.0
    assert sorted(p.name for p in (tmp_path / "cache").glob("*.pt")) == ["prior_k1.in_process.pt", "prior_k2.in_process.pt"]


def test_an_unreadable_or_unfitting_entry_is_one_line_and_made_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache, calls = ArtifactCache(tmp_path, "in_process"), []
    cache.fetch("prior", "k", _maker(calls))
    cache.path("prior", "k").write_bytes(b"not a checkpoint")
    with caplog.at_level(logging.WARNING, logger="fdattack"):
        remade = cache.fetch("prior", "k", _maker(calls, value=5.0))
    assert calls == [1, 1] and float(remade["net"]["w"][0, 0]) == 5.0
    (line,) = [r.getMessage() for r in caplog.records]
    assert "prior_k.in_process.pt" in line and "unusable" in line and "\n" not in line
    assert float(cache.fetch("prior", "k", _maker(calls))["net"]["w"][0, 0]) == 5.0 and calls == [1, 1]  # stored again

    def wants_three_by_three(payload: dict) -> None:
        if payload["net"]["w"].shape != (3, 3):
            raise ValueError("not a 3x3 network")

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fdattack"):
        cache.fetch("prior", "k", _maker(calls), check=wants_three_by_three)
    assert calls == [1, 1, 1] and "not a 3x3 network" in caplog.records[0].getMessage()


def test_a_reader_that_is_not_the_writer_makes_without_storing(tmp_path: Path) -> None:
    cache, calls = ArtifactCache(tmp_path, "in_process"), []
    cache.fetch("prior", "k", _maker(calls), writer=False)
    assert calls == [1] and not list(tmp_path.glob("*.pt"))
    cache.fetch("prior", "k", _maker(calls))
    cache.fetch("prior", "k", _maker(calls), writer=False)  # a non-writing rank reads what the first rank wrote
    assert calls == [1, 1]


def test_two_asking_at_once_make_it_once(tmp_path: Path) -> None:
    """The second asker waits on the entry's lock (flock: separate opens conflict, in threads as in processes) and reads
    what the first made."""
    cache, calls, got = ArtifactCache(tmp_path, "in_process"), [], []
    threads = [threading.Thread(target=lambda: got.append(cache.fetch("gan", "k", _maker(calls, seconds=0.3)))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [1] and len(got) == 2 and torch.equal(got[0]["net"]["w"], got[1]["net"]["w"])
