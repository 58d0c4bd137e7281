"""What ``cache_dir`` holds is checked before it is used (issue 56, finding 6; fdattack/tracking/artifact_cache.py).

An entry whose content no longer matches its digest is made again; an isolated run reads only the entries an isolated
run wrote, never an in-process run's (whose attacks share its process and could have written any file), while an
in-process run reads either; an attack's cache handle holds no path; and an in-process attack that rewrites the cached
evaluation classifier changes no score of a later isolated run.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path, PurePath
from types import ModuleType
from typing import Callable, Iterator

import pytest
import torch

from fdattack import plugins
from fdattack.attacks import ATTACKS
from fdattack.config import compose
from fdattack.experiment import Experiment
from fdattack.tracking.artifact_cache import MODES, ArtifactCache
from tests.conftest import own_messages, tiny
from tests.object_graph import reachable

KIND = "identity_classifier"
#: one round, a quick evaluation classifier and the public-mean baseline, scored with it
SMALL = ["protocol.rounds=1", "evaluation.epochs=2", "evaluation.confidence_gap.enabled=false"]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _maker(calls: list[float], value: float) -> Callable[[], dict]:
    def make() -> dict:
        calls.append(value)
        return {"net": {"w": torch.full((2, 2), value), "batches": torch.tensor(3)}, "classifier": "cnn"}

    return make


def _value(payload: dict) -> float:
    return float(payload["net"]["w"][0, 0])


@pytest.mark.parametrize("mode", MODES)
def test_an_entry_whose_content_was_changed_on_disk_is_made_again(tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: str) -> None:
    cache, calls = ArtifactCache(tmp_path, mode), []
    cache.fetch(KIND, "k", _maker(calls, 1.0))
    path = cache.path(KIND, "k")
    payload = torch.load(path, weights_only=True)
    payload["net"]["w"] = torch.full((2, 2), 9.0)  # other weights of the same shape: still a valid checkpoint
    torch.save(payload, path)
    with caplog.at_level(logging.WARNING, logger="fdattack"):
        remade = cache.fetch(KIND, "k", _maker(calls, 2.0))
    assert calls == [1.0, 2.0] and _value(remade) == 2.0
    (line,) = own_messages(caplog)
    assert path.name in line and "digest" in line and "\n" not in line
    assert _value(cache.fetch(KIND, "k", _maker(calls, 3.0))) == 2.0 and calls == [1.0, 2.0]  # stored again, and read back


def test_an_isolated_run_reads_no_in_process_entry_and_an_in_process_run_reads_an_isolated_one(tmp_path: Path) -> None:
    calls: list[float] = []
    inside, isolated = ArtifactCache(tmp_path / "a", "in_process"), ArtifactCache(tmp_path / "a", "process")
    inside.fetch(KIND, "k", _maker(calls, 1.0))
    written = inside.path(KIND, "k").read_bytes()
    assert _value(isolated.fetch(KIND, "k", _maker(calls, 2.0))) == 2.0 and calls == [1.0, 2.0]  # made again
    assert inside.path(KIND, "k").read_bytes() == written  # the in-process entry left as it was, the isolated one beside it
    assert sorted(p.name for p in (tmp_path / "a").glob("*.pt")) == [f"{KIND}_k.in_process.pt", f"{KIND}_k.process.pt"]
    assert _value(inside.fetch(KIND, "k", _maker(calls, 3.0))) == 2.0  # an in-process run reads the isolated entry first

    calls.clear()
    ArtifactCache(tmp_path / "b", "process").fetch(KIND, "k", _maker(calls, 4.0))
    assert _value(ArtifactCache(tmp_path / "b", "in_process").fetch(KIND, "k", _maker(calls, 5.0))) == 4.0 and calls == [4.0]
    assert [p.name for p in (tmp_path / "b").glob("*.pt")] == [f"{KIND}_k.process.pt"]  # read, nothing written


def test_an_in_process_entry_renamed_as_an_isolated_one_is_not_read(tmp_path: Path) -> None:
    calls: list[float] = []
    inside, isolated = ArtifactCache(tmp_path, "in_process"), ArtifactCache(tmp_path, "process")
    inside.fetch(KIND, "k", _maker(calls, 1.0))
    os.replace(inside.path(KIND, "k"), isolated.path(KIND, "k"))
    assert _value(isolated.fetch(KIND, "k", _maker(calls, 2.0))) == 2.0 and calls == [1.0, 2.0]


def test_an_attack_s_cache_handle_holds_no_path(tmp_path: Path) -> None:
    """The handle an in-process attack gets: ``fetch`` in its own folder, and nothing reachable from it (its attributes,
    slots, methods, closures) is a path or a string naming the cache's folder."""
    cache_dir = tmp_path / "cache"
    exp = Experiment(compose(None, tiny(tmp_path, *SMALL, "attacks=[public_mean]", "evaluation.classifier=null", f"cache_dir={cache_dir}")))
    exp.run()
    handle = exp.attacks[0].context.cache
    assert handle is not None and _value(handle.fetch("probe", "k", _maker([], 1.0))) == 1.0
    assert not {"root", "path", "__dict__"} & set(dir(handle))
    held = list(reachable(handle, *(getattr(handle, name) for name in dir(handle)), atoms=True))
    assert not [o for o in held if isinstance(o, (PurePath, os.PathLike))]
    assert not [o for o in held if isinstance(o, (str, bytes)) and str(tmp_path) in str(o)]
    assert (cache_dir / "attacks" / "public_mean" / "probe_k.in_process.pt").is_file()  # its entries went to its own folder


def _metrics(folder: Path, *overrides: str) -> dict[str, float]:
    metrics = Experiment(compose(None, tiny(folder, *SMALL, *overrides))).run()
    return {k: v for k, v in metrics.items() if not k.startswith("time/")}


@pytest.fixture
def hostile_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """``tests/hostile_cache.py``, imported for this test only: its attack is registered in a copy of the registry."""
    monkeypatch.setattr(ATTACKS, "_items", dict(ATTACKS._items))
    monkeypatch.setattr(plugins, "_LOADED", dict(plugins._LOADED))
    sys.modules.pop("tests.hostile_cache", None)
    yield importlib.import_module("tests.hostile_cache")
    sys.modules.pop("tests.hostile_cache", None)


@pytest.mark.slow
def test_an_in_process_attack_that_rewrites_the_evaluation_classifier_changes_no_isolated_score(
    tmp_path: Path, hostile_cache: ModuleType
) -> None:
    shared, fresh = f"cache_dir={tmp_path / 'shared'}", f"cache_dir={tmp_path / 'fresh'}"
    _metrics(tmp_path / "hostile", "plugins=[tests.hostile_cache]", "attacks=[hostile_cache]", shared)
    # it found the classifier (a walk of memory may meet an earlier test's config too) and rewrote it
    assert [p.parent for p in hostile_cache.REWRITTEN if tmp_path in p.parents] == [tmp_path / "shared" / "evaluation"]
    isolated = ["attacks=[public_mean]", "isolation.mode=process"]
    after = _metrics(tmp_path / "after", *isolated, shared)
    clean = _metrics(tmp_path / "clean", *isolated, fresh)
    assert "attack/public_mean/eval_classifier_accuracy" in clean and after == clean
    assert _metrics(tmp_path / "in_process", "attacks=[public_mean]", shared) == clean  # the rewrite breaks the digest
