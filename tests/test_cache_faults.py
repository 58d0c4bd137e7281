"""Faults of the cache are one line and exit status 2 (a ``cache_dir`` that is a file or lies inside ``output_dir``) or one
warning and the network trained anew (an entry that is a folder, a read-only cache, a lock held too long), never a
traceback or a silent wait (issue 57)."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest
import torch

from fdattack.cli import main
from fdattack.tracking import artifact_cache
from fdattack.tracking.artifact_cache import ArtifactCache, EntryLock

RUN = ["run", "--print-config", "data=digits", "protocol.num_clients=2", "attacks=[]", "logger.wandb.mode=disabled"]


def _maker(calls: list[int]) -> object:
    def make() -> dict:
        calls.append(1)
        return {"net": torch.full((2,), float(len(calls)))}

    return make


def test_a_cache_dir_that_is_a_file_or_inside_output_dir_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "cache"
    file.write_text("not a folder")
    assert main([*RUN, f"cache_dir={file / 'inner'}"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"fdattack: error: cache_dir='{file / 'inner'}': {file} is a file, not a folder; name a folder for the cache, or null"
    )
    assert main([*RUN, f"output_dir={tmp_path / 'run'}", f"cache_dir={tmp_path / 'run' / 'cache'}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "lies inside output_dir" in err


def test_an_entry_that_is_a_folder_is_trained_anew_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache, calls = ArtifactCache(tmp_path, "in_process"), []
    cache.path("net", "k").mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="fdattack"):
        assert cache.fetch("net", "k", _maker(calls))["net"].tolist() == [1.0, 1.0]  # type: ignore[arg-type]
        cache.fetch("net", "k", _maker(calls))  # type: ignore[arg-type]
    assert len(calls) == 2 and cache.path("net", "k").is_dir()
    assert [r.getMessage() for r in caplog.records if "cannot be kept" in r.getMessage()][0].endswith("the net trained here is used")


def test_a_read_only_cache_is_read_and_what_it_lacks_is_trained_unkept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, calls = ArtifactCache(tmp_path, "in_process"), []
    cache.fetch("net", "kept", _maker(calls))  # type: ignore[arg-type]

    def read_only(path: Path) -> EntryLock:  # what opening the lock for writing raises on a read-only filesystem
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(artifact_cache, "EntryLock", read_only)
    with caplog.at_level(logging.WARNING, logger="fdattack"):
        assert cache.fetch("net", "kept", _maker(calls))["net"].tolist() == [1.0, 1.0]  # type: ignore[arg-type]
        assert not caplog.records and len(calls) == 1  # read back, no warning
        cache.fetch("net", "missing", _maker(calls))  # type: ignore[arg-type]
    assert len(calls) == 2 and not cache.path("net", "missing").exists()
    assert "cannot be written (Read-only file system" in caplog.records[0].getMessage()


def test_a_lock_held_too_long_is_waited_for_with_its_holder_named_then_given_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(artifact_cache, "LOCK_WAIT_S", 1.0)
    cache, calls = ArtifactCache(tmp_path, "in_process"), []
    with EntryLock(tmp_path / f".{cache.path('net', 'k').stem}.lock") as stuck:  # a process that never finishes
        assert stuck.wait("the net k")
        with caplog.at_level(logging.INFO, logger="fdattack"):
            assert cache.fetch("net", "k", _maker(calls))["net"].tolist() == [1.0, 1.0]  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records]
    assert f"held by process {os.getpid()}" in lines[0] and "to finish the net k, at most 1 s" in lines[0]
    assert lines[1].startswith("gave up waiting for") and "made here, unkept" in lines[1]
    assert not cache.path("net", "k").exists()  # nothing kept over the holder's work
    assert (tmp_path / f".{cache.path('net', 'k').stem}.lock").read_text() == ""  # a released lock names no holder
    cache.fetch("net", "k", _maker(calls))  # type: ignore[arg-type]
    assert len(calls) == 2 and cache.path("net", "k").is_file()  # the lock free again, it is kept
