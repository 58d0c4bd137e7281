"""The matrix owns its root: it marks it, refuses another matrix's root, a seeds aggregate's folder and a run's
directory, and a run or a seeds aggregate refuses a matrix's root (issue 57: another matrix's root lost its
``matrix.json``, ``matrix.csv`` and ``page/``, and a seeds aggregate was written beside ``matrix.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fdattack.cli import main
from fdattack.tracking.folder_owner import MATRIX_MARKER
from tests.test_matrix import matrix_file, run_matrix

ONE_CELL = dict(protocols={"fedmd": ["protocol=fedmd"]}, defenses={"none": []}, attacks=["ldia"], seeds=[0])
RUN = ["run", "data=digits", "protocol.num_clients=2", "protocol.rounds=1", "attacks=[]", "logger.wandb.mode=disabled"]


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def matrix_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny matrix's finished root: one cell, one seed."""
    folder = tmp_path_factory.mktemp("owned")
    assert run_matrix(matrix_file(folder, **ONE_CELL), folder / "root") == 0
    return folder / "root"


def test_a_matrix_marks_its_root_and_another_matrix_is_refused_there(
    matrix_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert json.loads((matrix_root / MATRIX_MARKER).read_text()) == {"matrix": "tiny"}
    before = _files(matrix_root)
    other = matrix_file(tmp_path, name="other", **ONE_CELL)
    assert run_matrix(other, matrix_root) == 2
    assert f"--root {matrix_root} is the root of the matrix 'tiny', not of 'other'" in capsys.readouterr().err
    assert _files(matrix_root) == before  # its matrix.json, matrix.csv and page/ untouched


def test_a_matrix_root_made_before_the_marker_is_known_by_its_matrix_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "old"
    root.mkdir()
    (root / "matrix.json").write_text(json.dumps({"name": "tiny", "cells": []}))
    assert run_matrix(matrix_file(tmp_path, name="other", **ONE_CELL), root, "--cell", "0") == 2
    assert "is the root of the matrix 'tiny'" in capsys.readouterr().err


@pytest.mark.parametrize("seeds", [None, [0, 1]], ids=["run", "seeds"])
def test_a_matrix_refuses_a_folder_holding_a_run_or_a_seeds_aggregate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seeds: list[int] | None
) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "config.yaml").write_text(f"seeds: {json.dumps(seeds)}\nseed: 0\n")
    (folder / "metrics.json").write_text('{"protocol/client_acc_mean": 0.5}')
    before = _files(folder)
    assert run_matrix(matrix_file(tmp_path, **ONE_CELL), folder) == 2
    held = "a run's results" if seeds is None else "a seeds aggregate"
    assert f"--root {folder} holds {held}" in capsys.readouterr().err
    assert _files(folder) == before


@pytest.mark.parametrize("seeds", [[], ["seeds=[0,1]"]], ids=["run", "seeds"])
def test_a_run_or_a_seeds_aggregate_refuses_a_matrix_root(matrix_root: Path, capsys: pytest.CaptureFixture[str], seeds: list[str]) -> None:
    before = _files(matrix_root)
    assert main([*RUN, *seeds, f"output_dir={matrix_root}"]) == 2
    assert f"output_dir {matrix_root} is the root of the matrix 'tiny'; choose another output_dir" in capsys.readouterr().err
    assert _files(matrix_root) == before
