"""``fdattack matrix``: which attacks apply where (from declarations), one simulation per cell and seed, resume, the
outputs, the sweep and SLURM paths, and bad matrix files."""

from __future__ import annotations

import csv
import json
import re
from multiprocessing.context import SpawnProcess
from pathlib import Path

import pytest
import yaml
from conftest import REPO, error_of

from fdattack.attacks.ldia import LDIAAttack
from fdattack.cli import main
from fdattack.config.packaged import PACKAGE_CONF_DIR, experiment_file
from fdattack.fd.threat import Capability
from fdattack.matrix import run as matrix_run
from fdattack.matrix.plan import plan_cell, plan_cells
from fdattack.matrix.spec import load_matrix

#: tiny simulations: 2 clients, 1 round, no evaluation classifier (public_mean and LDIA need no training of their own)
QUICK = [
    "logger.wandb.mode=disabled",
    "logger.progress=never",
    "protocol.num_clients=2",
    "protocol.rounds=1",
    "evaluation.confidence_gap.enabled=false",
    "evaluation.classifier=null",
]


def matrix_file(tmp_path: Path, **changes: object) -> Path:
    """2 protocols x 2 defenses x 2 attacks x 2 seeds on the digits (FedAvg can take neither attack nor Laplace)."""
    spec: dict[str, object] = {
        "name": "tiny",
        "overrides": QUICK,
        "seeds": [0, 1],
        "data": {"digits": ["data=digits"]},
        "protocols": {"fedmd": ["protocol=fedmd"], "dsfl": ["protocol=dsfl"]},
        "defenses": {"none": [], "laplace": ["defenses=[laplace]", "defense.laplace.scale=1.0"]},
        "attacks": ["public_mean", "ldia"],
        **changes,
    }
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_matrix(path: Path, root: Path, *extra: str) -> int:
    return main(["matrix", str(path), "--root", str(root), *extra])


# -------------------------------------------------------------------------------------------- applicability
def test_what_applies_is_decided_from_declared_needs_and_offers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    protocols = {"fedmd": ["protocol=fedmd"], "fedavg": ["protocol=fedavg"]}
    spec = load_matrix(matrix_file(tmp_path, protocols=protocols, attacks=["public_mean", "ldia", "gmi"]))
    cells = {c.id: c for c in plan_cells(spec)}
    assert cells["digits/fedmd/none"].attacks == ("public_mean", "ldia")
    assert "white_box" in cells["digits/fedmd/none"].not_applicable["gmi"]
    assert cells["digits/fedmd/laplace"].runs
    laplace = cells["digits/fedavg/laplace"]
    assert not laplace.runs and "output_uploads" in (laplace.reason or "") and "fedavg" in (laplace.reason or "")
    fedavg = cells["digits/fedavg/none"]  # GMI also needs the attacker's prior data, which the PLI split does not give
    assert not fedavg.runs and fedavg.reason == "none of the matrix's attacks applies"
    assert "prior_data" in fedavg.not_applicable["gmi"] and "data.split=pli" in fedavg.not_applicable["gmi"]
    assert "public_data" in fedavg.not_applicable["public_mean"]

    # the same matrix with LDIA declaring FedAvg's white box instead of the uploads: it moves to FedAvg alone
    monkeypatch.setattr(LDIAAttack, "needs", frozenset({Capability.white_box}))
    cells = {c.id: c for c in plan_cells(spec)}
    assert cells["digits/fedavg/none"].attacks == ("ldia",)
    assert "ldia" in cells["digits/fedmd/none"].not_applicable


def test_the_l_attack_applies_only_where_the_config_fixes_its_class_as_a_target(tmp_path: Path) -> None:
    """The L-Attack reveals the class c* it names in its settings; the PLI split draws the targets with the seed, so
    c* may be public there (the evaluator would refuse the result at run time): n/a, with the split that fixes it."""
    data = {"digits": ["data=digits"], "cut": ["data=digits_lattack", "protocol.num_clients=7"]}
    spec = load_matrix(matrix_file(tmp_path, data=data, protocols={"fedmd": ["protocol=fedmd"]}, attacks=["ldia", "lattack"]))
    cells = {c.id: c for c in plan_cells(spec)}
    assert cells["digits/fedmd/none"].attacks == ("ldia",)
    reason = cells["digits/fedmd/none"].not_applicable["lattack"]
    assert "fixed_targets" in reason and "data.split=pli" in reason and "data=digits_lattack" in reason
    assert cells["cut/fedmd/none"].attacks == ("ldia", "lattack")


def test_skip_leaves_cells_out_with_the_pattern_as_reason(tmp_path: Path) -> None:
    cells = {c.id: c for c in plan_cells(load_matrix(matrix_file(tmp_path, skip=["*/dsfl/lap*"])))}
    assert cells["digits/dsfl/laplace"].reason == "skipped by the matrix file (*/dsfl/lap*)"
    assert cells["digits/dsfl/none"].runs and cells["digits/fedmd/laplace"].runs


def test_a_four_part_skip_leaves_an_attack_out_of_the_cells_it_matches(tmp_path: Path) -> None:
    """``data/protocol/defense/attack``: the attack is n/a there with the pattern; the cell runs its other attacks."""
    cells = {c.id: c for c in plan_cells(load_matrix(matrix_file(tmp_path, skip=["digits/fedmd/*/ld*"])))}
    for defense in ("none", "laplace"):
        fedmd = cells[f"digits/fedmd/{defense}"]
        assert fedmd.attacks == ("public_mean",) and fedmd.not_applicable == {"ldia": "skipped by the matrix file (digits/fedmd/*/ld*)"}
        assert "attacks=[public_mean]" in fedmd.overrides
    assert cells["digits/dsfl/none"].attacks == ("public_mean", "ldia")
    only = {c.id: c for c in plan_cells(load_matrix(matrix_file(tmp_path, skip=["*/*/none/*"])))}
    assert not only["digits/fedmd/none"].runs and only["digits/fedmd/none"].reason == "none of the matrix's attacks applies"


# -------------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny_matrix(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny matrix run once (8 simulations, about 10 s on one core)."""
    tmp = tmp_path_factory.mktemp("matrix")
    path, root = matrix_file(tmp), tmp / "root"
    assert run_matrix(path, root) == 0
    return path, root


def test_one_simulation_per_cell_and_seed_and_every_applicable_attack_on_it(tiny_matrix: tuple[Path, Path]) -> None:
    _, root = tiny_matrix
    matrix = json.loads((root / "matrix.json").read_text())
    assert [c["id"] for c in matrix["cells"]] == ["digits/fedmd/none", "digits/fedmd/laplace", "digits/dsfl/none", "digits/dsfl/laplace"]
    for cell in matrix["cells"]:
        assert cell["status"] == "done" and cell["seeds"] == [0, 1]
        folder = root / cell["id"]
        finals = [json.loads((folder / f"seed_{s}" / "metrics.json").read_text()) for s in (0, 1)]
        for attack in ("public_mean", "ldia"):  # both attacks observed each simulation
            assert all(any(k.startswith(f"attack/{attack}/") for k in final) for final in finals)
        kl = cell["metrics"]["attack/ldia/kl"]
        assert kl["values"] == [final["attack/ldia/kl"] for final in finals]
        assert kl["mean"] == pytest.approx(sum(kl["values"]) / 2)
        assert kl["ci_low"] < kl["mean"] < kl["ci_high"]  # the t interval over 2 seeds that differ
        assert json.loads((folder / "metrics.json").read_text())["attack/ldia/kl"] == pytest.approx(kl["mean"])  # the cell's aggregate
        replica = yaml.safe_load((folder / "seed_0" / "config.yaml").read_text())
        assert replica["logger"]["wandb"]["group"] == "tiny" and replica["logger"]["wandb"]["job_type"] == "matrix-cell"
        assert replica["attacks"] == ["public_mean", "ldia"] and replica["seed"] == 0
        assert replica["cache_dir"] == str(root / "cache")  # one cache of cell-free networks for the whole matrix
    assert (root / "digits/fedmd/laplace/seed_0/config.yaml").read_text().count("laplace") >= 1
    images = matrix["cells"][0]["images"]  # the last round's reconstructions of each seed, for the page to show
    assert list(images) == ["public_mean"] and images["public_mean"] == [
        f"digits/fedmd/none/seed_{s}/images/attack_public_mean_reconstructions_round_0001.png" for s in (0, 1)
    ]
    assert all((root / p).is_file() for p in images["public_mean"])
    assert matrix["headline"]["ldia"][0] == "attack/ldia/kl" and "protocol/client_acc_mean" in matrix["utility"]
    page = (root / "page" / "index.html").read_text()
    assert page.count("heatmap__digits__attack-ldia-kl.png") == 1 and (root / "page/plots/heatmap__digits__attack-ldia-kl.png").is_file()
    assert not (root / "wandb").exists()  # logger.wandb.mode=disabled: no summary run either


def test_matrix_csv_has_a_row_per_cell_and_metric(tiny_matrix: tuple[Path, Path]) -> None:
    _, root = tiny_matrix
    rows = list(csv.DictReader((root / "matrix.csv").open()))
    kl = [r for r in rows if r["metric"] == "attack/ldia/kl"]
    assert [(r["protocol"], r["defense"]) for r in kl] == [("fedmd", "none"), ("fedmd", "laplace"), ("dsfl", "none"), ("dsfl", "laplace")]
    matrix = json.loads((root / "matrix.json").read_text())
    for row, cell in zip(kl, matrix["cells"]):
        assert float(row["mean"]) == pytest.approx(cell["metrics"]["attack/ldia/kl"]["mean"], rel=1e-5)
        assert row["seeds"] == "2" and row["status"] == "done" and len(row["values"].split(";")) == 2


def test_running_again_runs_nothing_and_a_new_defense_only_its_cells(
    tiny_matrix: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, root = tiny_matrix
    before = json.loads((root / "matrix.json").read_text())
    capsys.readouterr()
    assert run_matrix(path, root) == 0
    assert "8 simulations, 8 done before, 0 to run" in capsys.readouterr().out
    assert json.loads((root / "matrix.json").read_text())["cells"] == before["cells"]

    spec = yaml.safe_load(path.read_text())
    spec["defenses"]["topk"] = ["defenses=[topk]", "defense.topk.k=1"]
    wider = tmp_path / "wider.yaml"
    wider.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert run_matrix(wider, root) == 0
    out = capsys.readouterr().out
    assert "12 simulations, 8 done before, 4 to run" in out
    ran = [re.match(r"\[[\d:]+\] \[\d+/\d+\] (\S+):", line) for line in out.splitlines()]
    assert sorted(found.group(1) for found in ran if found) == [
        "digits/dsfl/topk/0",
        "digits/dsfl/topk/1",
        "digits/fedmd/topk/0",
        "digits/fedmd/topk/1",
    ]


def test_a_simulation_cut_short_resumes_from_its_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = matrix_file(tmp_path, protocols={"fedmd": ["protocol=fedmd", "protocol.rounds=2", "checkpoint_every=1"]}, defenses={"none": []})
    root = tmp_path / "root"
    assert run_matrix(path, root, "--cell", "digits/fedmd/none/0") == 0
    seed_0 = root / "digits/fedmd/none/seed_0"
    uncut = json.loads((seed_0 / "metrics.json").read_text())
    (seed_0 / "metrics.json").unlink()  # as if killed after its last checkpoint
    (seed_0 / "checkpoints" / "round_0002.pt").unlink()
    assert run_matrix(path, root) == 0
    assert "resuming" in (root / "digits/fedmd/none/seed_0.log").read_text()
    resumed = json.loads((seed_0 / "metrics.json").read_text())
    assert resumed["attack/ldia/kl"] == pytest.approx(uncut["attack/ldia/kl"], rel=1e-4, abs=1e-5)


# -------------------------------------------------------------------------------------------- other machines
def test_list_cell_and_sweep_file_name_the_same_simulations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, root = matrix_file(tmp_path, protocols={"fedmd": ["protocol=fedmd"], "fedavg": ["protocol=fedavg"]}), tmp_path / "root"
    assert run_matrix(path, root, "--list") == 0
    listed = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [row[1] for row in listed] == [f"digits/{p}/{d}/{s}" for p in ("fedmd", "fedavg") for d in ("none", "laplace") for s in (0, 1)]
    assert listed[4][2].startswith("n/a: none of the matrix's attacks applies")
    assert run_matrix(path, root, "--cell", "1") == 0  # an index, as a SLURM array task gives it
    assert (root / "digits/fedmd/none/seed_1/metrics.json").is_file() and not (root / "digits/fedmd/none/seed_0").exists()
    capsys.readouterr()
    assert run_matrix(path, root, "--cell", "digits/fedavg/none/0") == 0
    assert "n/a" in capsys.readouterr().out and not (root / "digits/fedavg").exists()

    from fdattack.sweep import load_sweep

    sweep_path = tmp_path / "sweep.yaml"
    assert run_matrix(path, root, "--sweep-file", str(sweep_path)) == 0
    sweep = load_sweep(sweep_path)  # a valid W&B sweep
    assert sweep["method"] == "grid" and sweep["command"][:3] == ["fdattack", "matrix", str(path.resolve())]
    assert sweep["command"][-1] == "${args}" and str(root.resolve()) in sweep["command"]
    assert sweep["parameters"]["cell"]["values"] == [f"digits/fedmd/{d}/{s}" for d in ("none", "laplace") for s in (0, 1)]


def test_an_isolated_matrix_runs_its_attacks_in_workers_and_reuses_no_in_process_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--isolation process``: each simulation runs in a fresh process (which composes its config, reading its attacks'
    declarations, before any data is there) and its attacks in sandboxed workers (their logs beside their folders), a
    simulation an in-process matrix ran in the same root is stale, not reused (an in-process attack could have read the
    run), and the sweep's agents run isolated too. Exactly one process is started per simulation (a pool that replaced
    each worker that ended started one more, for nothing, and waited for it)."""
    path = matrix_file(tmp_path, protocols={"fedmd": ["protocol=fedmd"]}, defenses={"none": []}, seeds=[0])
    root = tmp_path / "root"
    assert run_matrix(path, root) == 0
    seed_0 = root / "digits/fedmd/none/seed_0"
    assert not (seed_0 / "attack_state" / "ldia.log").exists()
    capsys.readouterr()
    assert run_matrix(path, root, "--isolation", "process") == 2
    err = capsys.readouterr().err
    assert "were made with other settings" in err and "isolation.mode" in err, err
    isolated = tmp_path / "isolated"
    monkeypatch.setattr(matrix_run, "_run_here", None)  # not in this process: each simulation in a fresh one
    started: list[int] = []
    start = SpawnProcess.start

    def counted_start(process: SpawnProcess) -> None:
        start(process)
        started.append(process.pid)

    monkeypatch.setattr(SpawnProcess, "start", counted_start)
    assert run_matrix(path, isolated, "--isolation", "process") == 0
    assert len(started) == 1, started  # one process for the one simulation: no replacement started for nothing
    worker_logs = sorted(p.name for p in (isolated / "digits/fedmd/none/seed_0/attack_state").glob("*.log"))
    assert worker_logs == ["ldia.log", "public_mean.log"]
    assert "mode: process" in (isolated / "digits/fedmd/none/seed_0/config.yaml").read_text()
    assert run_matrix(path, isolated, "--isolation", "process", "--sweep-file", str(tmp_path / "sweep.yaml")) == 0
    assert yaml.safe_load((tmp_path / "sweep.yaml").read_text())["command"][-3:] == ["--isolation", "process", "${args}"]


# -------------------------------------------------------------------------------------------- faults
def test_jobs_run_in_processes_with_their_share_of_the_cores_and_a_failure_leaves_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two simulations at once (``--jobs 2``), one failing on a fault only the run itself finds (a Dirichlet split into more
    clients than the pool can fill is refused once the data is loaded): the other finishes, with one torch thread of this
    machine's cores (2 or fewer here)."""
    crowded = ["data=digits", "data.split=random", "data.partition=dirichlet", "data.min_client_size=16", "protocol.num_clients=500"]
    path = matrix_file(
        tmp_path,
        data={"digits": ["data=digits"], "crowded": crowded},
        protocols={"fedmd": ["protocol=fedmd"]},
        defenses={"none": []},
        attacks=["ldia"],
        seeds=[0],
    )
    root = tmp_path / "root"
    assert run_matrix(path, root, "--jobs", "2") == 2
    err = error_of(capsys.readouterr().err)
    assert "1 of 2 simulations failed" in err and "crowded/fedmd/none/0" in err and "500" in err
    cells = {c["id"]: c for c in json.loads((root / "matrix.json").read_text())["cells"]}
    assert cells["digits/fedmd/none"]["status"] == "done"
    assert cells["crowded/fedmd/none"]["status"] == "failed" and "500" in cells["crowded/fedmd/none"]["reason"]
    machine = json.loads((root / "digits/fedmd/none/seed_0/machine.json").read_text())
    assert (machine[-1] if isinstance(machine, list) else machine)["torch_threads"] == 1


BAD_MATRICES = [
    ({"seedz": [0]}, "unknown key 'seedz'; did you mean 'seeds'?"),
    ({"seeds": [0, 0]}, "each seed once"),
    ({"seeds": "0"}, "seeds must be a non-empty list of integers"),
    ({"attacks": ["pli", "nope"]}, "attacks: 'nope' is not a known attack"),
    ({"defenses": {"a/b": []}}, "'a/b' is not a plain name"),
    ({"protocols": {"fedmd": "protocol=fedmd"}}, "protocols.fedmd must be a list of key=value"),
    ({"data": {"digits": ["data.split=sideways"]}}, "cell digits/fedmd/none: "),
    ({"skip": ["fedmd/*"]}, "skip must be a list of data/protocol/defense patterns"),
    ({"skip": ["digits/*/*/lira"]}, "'lira' matches none of attacks (public_mean, ldia)"),
    ({"protocols": {}}, "protocols must map at least one setting"),
    ({"defenses": {"lap": {"overrides": ["defenses=[laplace]"]}}}, "a curve has exactly the keys overrides and strengths"),
    ({"defenses": {"lap": {"overrides": [], "strengths": {"a": [1, 2], "b": [1, 2]}}}}, "strengths must map one config key"),
    ({"defenses": {"lap": {"overrides": [], "strengths": {"defense.laplace.scale": [1]}}}}, "two or more distinct numbers"),
    ({"defenses": {"lap": {"overrides": [], "strengths": {"defense.laplace.scale": [1, "x"]}}}}, "two or more distinct numbers"),
    (
        {"defenses": {"lap_1": [], "lap": {"overrides": ["defenses=[laplace]"], "strengths": {"defense.laplace.scale": [1, 2]}}}},
        "its setting 'lap_1' (strength 1) is also a defense of its own",
    ),
    ({"defenses": {"lap": {"overrides": [], "strengths": {"seed": [1, 2]}}}}, "would be ignored: the matrix sets seed"),
    (
        {"defenses": {"topk": {"overrides": ["defenses=[topk]"], "strengths": {"defense.laplace.scale": [1, 2]}}}},
        "defenses.topk: its strengths set defense.laplace.scale, but its overrides enable topk: every strength would give the same run",
    ),
]


def test_a_defense_given_at_several_strengths_is_one_setting_per_strength_in_the_files_order(tmp_path: Path) -> None:
    curve = {"overrides": ["defenses=[laplace]"], "strengths": {"defense.laplace.scale": [2, 0.5, 1]}}
    spec = load_matrix(matrix_file(tmp_path, defenses={"none": [], "laplace": curve, "topk_1": ["defenses=[topk]", "defense.topk.k=1"]}))
    assert list(spec.defenses) == ["none", "laplace_2", "laplace_0.5", "laplace_1", "topk_1"]
    assert spec.defenses["laplace_0.5"] == ("defenses=[laplace]", "defense.laplace.scale=0.5")
    assert spec.curves["laplace"].key == "defense.laplace.scale"
    assert spec.curves["laplace"].settings == (("laplace_2", 2.0), ("laplace_0.5", 0.5), ("laplace_1", 1.0))
    cell = plan_cell(spec, "digits", "fedmd", "laplace_0.5")  # it composes: the strength reaches its key
    assert "defense.laplace.scale=0.5" in cell.overrides and cell.reason is None


@pytest.mark.parametrize(("change", "named"), BAD_MATRICES, ids=[c[1][:24] for c in BAD_MATRICES])
def test_a_bad_matrix_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, object], named: str
) -> None:
    assert run_matrix(matrix_file(tmp_path, **change), tmp_path / "root") == 2
    err = error_of(capsys.readouterr().err)
    assert named in err and "\n" not in err
    assert not (tmp_path / "root").exists()


def test_bad_command_lines_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = matrix_file(tmp_path)
    (tmp_path / "file").write_text("x")
    for extra, named in (
        (["--jobs", "0"], "--jobs 0"),
        (["--cell", "digits/fedmd/none/7"], "no such simulation"),
        (["--cell", "99"], "this matrix has 8 simulations"),
    ):
        assert run_matrix(path, tmp_path / "root", *extra) == 2
        assert named in error_of(capsys.readouterr().err)
    assert run_matrix(path, tmp_path / "file") == 2
    assert "exists and is not a folder" in error_of(capsys.readouterr().err)
    assert main(["matrix", str(tmp_path / "missing.yaml")]) == 2
    assert "matrix file not found" in error_of(capsys.readouterr().err)


def test_the_w_and_b_summary_run_is_logged_once_per_new_state_of_the_matrix(tmp_path: Path) -> None:
    quick_offline = [t for t in QUICK if not t.startswith("logger.wandb.mode")] + ["logger.wandb.mode=offline"]
    path = matrix_file(tmp_path, overrides=quick_offline, protocols={"fedmd": ["protocol=fedmd"]}, defenses={"none": []}, seeds=[0])
    root = tmp_path / "root"
    assert run_matrix(path, root) == 0
    summaries = sorted((root / "wandb").glob("offline-run-*"))
    assert len(summaries) == 1
    cell_runs = list((root / "digits/fedmd/none/seed_0/wandb").glob("offline-run-*"))
    assert len(cell_runs) == 1  # the simulation's own run, in the matrix's group
    assert run_matrix(path, root) == 0  # nothing new: no second summary
    assert sorted((root / "wandb").glob("offline-run-*")) == summaries


@pytest.mark.parametrize("preset", ["small", "gpu", "paper"])
def test_the_presets_read_and_name_what_exists(preset: str) -> None:
    """The presets parse; every experiment they name is one of the package's; small and gpu run every attack, 3 seeds, each defense
    as a curve of several strengths (LabelAvg as a protocol row)."""
    spec = load_matrix(REPO / "conf" / "matrix" / f"{preset}.yaml")
    tokens = [t for axis in (spec.data, spec.protocols, spec.defenses) for overrides in axis.values() for t in overrides]
    for token in tokens:
        if token.startswith("experiment="):
            assert experiment_file(token.partition("=")[2]).resolve().parent == PACKAGE_CONF_DIR / "experiment", token  # by name
    assert spec.seeds == (0, 1, 2)
    if preset in ("small", "gpu"):
        from fdattack.attacks.base import ATTACKS

        assert set(spec.attacks) == set(ATTACKS.names())
        curves = {name: len(curve.settings) for name, curve in spec.curves.items()}
        assert set(curves) == {"laplace", "topk", "dpsgd", "mid"} and min(curves.values()) >= 2
        assert "labelavg" in spec.protocols


def test_each_simulation_s_line_has_its_time_and_what_is_left_at_the_pace_so_far(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 58: 198 lines for the small preset, none saying when it would end."""
    import time

    assert matrix_run._eta(1, 3, time.monotonic() - 120) == "; 2 left, about 4 min"
    assert matrix_run._eta(2, 3, time.monotonic() - 10) == "; 1 left, under a minute"
    assert matrix_run._eta(3, 3, time.monotonic() - 10) == ""
    path = matrix_file(tmp_path, protocols={"fedmd": ["protocol=fedmd"]}, defenses={"none": []}, attacks=["ldia"])
    assert run_matrix(path, tmp_path / "root") == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "digits/fedmd/none/" in line and line.endswith(")")]
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] \[1/2\] digits/fedmd/none/0: done \(\d+ s; 1 left, (under a minute|about \d+ min)\)", lines[0])
