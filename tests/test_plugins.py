"""Plugins (:mod:`fdattack.plugins`): an attack from the user's own package, found through its entry point, or from a
module that ``plugins=[...]`` names; a plugin that does not import, registers nothing, takes a registered name or
leaves a process-wide torch hook behind is one line and exit status 2.

The plugin is the worked example of docs/plugins.md, taken from the page itself (its python and toml blocks), so the
page shows what runs. The in-process tests restore the registries, the record of loaded plugins, ``sys.modules`` and
torch's global hook tables and mode stacks afterwards (:func:`plugin_folder`).
"""

from __future__ import annotations

import gc
import importlib
import json
import math
import os
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Iterator

import pytest
import torch
from torch.nn.modules import module as nn_module

from fdattack import plugins
from fdattack.attacks import ATTACKS
from fdattack.cli import main
from fdattack.config import compose, help_config
from fdattack.defenses import DEFENSES
from fdattack.errors import ConfigError
from fdattack.experiment import run
from fdattack.fd.protocols import PROTOCOLS
from fdattack.matrix.spec import load_matrix
from fdattack.plugins import load_plugins, loaded_plugins
from tests.conftest import REPO, error_of, tiny
from tests.test_docs_examples import blocks

EXAMPLE = {block.lang: block.code for block in reversed(blocks(REPO / "docs" / "plugins.md")) if block.lang in ("python", "toml")}
#: the example's module (docs/plugins.md), registering the attack ``myattack``
VOTES = EXAMPLE["python"]
#: a plugin that registers an attack of its own (``name``)
SMALL = """
from dataclasses import dataclass

from fdattack.attacks.base import ATTACKS, Attack

@ATTACKS.register({name!r})
class Small(Attack):
    Settings = dataclass(type("SmallSettings", (), {{}}))
"""


# ----------------------------------------------------------------------------- the installed package, end to end


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/plugins.md's package ``fdattack-myattack``, installed by pip (offline, no build isolation) into a folder of
    its own, which holds the module and its dist-info with the entry point."""
    root = tmp_path_factory.mktemp("plugin")
    package = root / "fdattack-myattack"
    (package / "fdattack_myattack").mkdir(parents=True)
    (package / "pyproject.toml").write_text(EXAMPLE["toml"])
    (package / "fdattack_myattack" / "__init__.py").write_text(VOTES)
    pip = ["install", "--no-deps", "--no-build-isolation", "--no-index", "--no-cache-dir", "--disable-pip-version-check", "--quiet"]
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *pip, "--target", str(root / "site"), str(package)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "site"


def run_installed_plugin(site: Path, out: Path, *extra: str) -> dict[str, float]:
    """``python -m fdattack run attacks=[myattack,ldia]`` on the embedded default shrunk to 2 clients and 1 round, in a
    process that finds the plugin only through the entry point of its dist-info in ``site``; ``extra`` overrides
    follow. Returns the run's metrics.json."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    argv = ["run", *tiny(out, "protocol.rounds=1", "attacks=[myattack,ldia]", *extra)]
    proc = subprocess.run([sys.executable, "-m", "fdattack", *argv], cwd=out, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "run" / "metrics.json").read_text())


@pytest.mark.parametrize("extra", [pytest.param((), id="in_process"), pytest.param(("isolation.mode=process",), id="isolated")])
def test_an_installed_plugins_attack_runs_from_the_command_line_and_is_scored(
    plugin_site: Path, tmp_path: Path, extra: tuple[str, ...]
) -> None:
    """The package's attack is scored by LDIA's scorer (the same truth, so the same baselines as LDIA's) and lands where
    honest votes land: KL(p ‖ p̂) 0.031, 0.157, 0.073, 0.076 at seeds 0, 1, 2, 42 (one run each, this setting),
    against the uniform guess's 1.407 at each, so half of it is a margin of 0.55 over the largest."""
    metrics = run_installed_plugin(plugin_site, tmp_path, *extra)
    ours = {key: value for key, value in metrics.items() if key.startswith("attack/myattack/")}
    for name in ("kl", "kl_eq7", "chebyshev", "l1", "tv", "kl_ci_low", "kl_ci_high", "uniform_kl", "random_kl"):
        assert math.isfinite(ours[f"attack/myattack/{name}"]), name
    assert 0 <= ours["attack/myattack/kl_ci_low"] <= ours["attack/myattack/kl"] <= ours["attack/myattack/kl_ci_high"]
    assert 0 < ours["attack/myattack/chebyshev"] <= ours["attack/myattack/tv"] + 1e-12 and ours["attack/myattack/tv"] <= 1  # max ≤ TV
    for baseline in ("uniform_kl", "random_kl", "random_chebyshev_mean1000"):
        assert ours[f"attack/myattack/{baseline}"] == metrics[f"attack/ldia/{baseline}"]
    assert ours["attack/myattack/kl"] < ours["attack/myattack/uniform_kl"] / 2


# ----------------------------------------------------------------------------- in process


@pytest.fixture
def plugin_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on ``sys.path`` for plugin modules; the registries, the loaded plugins, the modules imported from the
    folder and torch's global hooks and mode stacks are as they were after the test."""
    for registry in (ATTACKS, DEFENSES, PROTOCOLS):
        monkeypatch.setattr(registry, "_items", dict(registry._items))
    monkeypatch.setattr(plugins, "_LOADED", {})
    folder = tmp_path / "modules"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    tables = {name: dict(table) for name, table in vars(nn_module).items() if name.startswith("_global_") and isinstance(table, dict)}
    modes = len(torch.overrides._get_current_function_mode_stack())
    yield folder
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(folder)):
            del sys.modules[name]
    for name, saved in tables.items():
        getattr(nn_module, name).clear()
        getattr(nn_module, name).update(saved)
    while len(torch.overrides._get_current_function_mode_stack()) > modes:
        torch.overrides._pop_mode()


def refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, *overrides: str) -> str:
    """``fdattack run`` with ``overrides``: exit status 2 and one error line, returned."""
    code = main(["run", *tiny(tmp_path, *overrides)])
    err = capsys.readouterr().err
    assert code == 2, err
    return error_of(err)


@pytest.mark.parametrize(
    ("code", "why"),
    [
        ("import fdattack_no_such_dependency\n", "ModuleNotFoundError: No module named 'fdattack_no_such_dependency'"),
        ("raise RuntimeError('no GPU here\\nsecond line')\n", "RuntimeError: no GPU here"),
    ],
    ids=["missing_dependency", "raises"],
)
def test_a_plugin_that_does_not_import_is_one_line_naming_it(
    plugin_folder: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, code: str, why: str
) -> None:
    (plugin_folder / "broken_plugin.py").write_text(code)
    line = refused(capsys, tmp_path, "plugins=[broken_plugin]", "attacks=[ldia]")
    assert line == f"fdattack: error: plugins: 'broken_plugin' does not import: {why}"
    assert refused(capsys, tmp_path, "plugins=[no_such_plugin]") == (
        "fdattack: error: plugins: 'no_such_plugin' does not import: ModuleNotFoundError: No module named 'no_such_plugin'"
    )
    assert not (tmp_path / "run").exists()


def test_a_plugin_that_registers_nothing_or_no_settings_is_one_line(
    plugin_folder: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (plugin_folder / "empty_plugin.py").write_text("from fdattack.attacks.base import ATTACKS\n")
    assert refused(capsys, tmp_path, "plugins=[empty_plugin]").startswith(
        "fdattack: error: plugins: 'empty_plugin' registers no attack, defense or protocol"
    )
    (plugin_folder / "bare_plugin.py").write_text(SMALL.format(name="bare").replace("    Settings = ", "    unsettled = "))
    assert refused(capsys, tmp_path, "plugins=[bare_plugin]") == (
        "fdattack: error: plugins: 'bare_plugin' registers attack 'bare' without a Settings dataclass (the dataclass of its knobs; "
        "an empty @dataclass will do)"
    )


def test_a_plugin_that_takes_a_registered_name_is_one_line_naming_both(
    plugin_folder: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (plugin_folder / "ldia_again.py").write_text(SMALL.format(name="ldia"))
    assert refused(capsys, tmp_path, "plugins=[ldia_again]") == (
        "fdattack: error: plugins: 'ldia_again' registers attack 'ldia', a name fdattack.attacks.ldia took already; rename it"
    )
    (plugin_folder / "first.py").write_text(SMALL.format(name="small"))
    (plugin_folder / "second.py").write_text(SMALL.format(name="small"))
    assert refused(capsys, tmp_path, "plugins=[first,second]").endswith(
        "'second' registers attack 'small', a name first took already; rename it"
    )


@pytest.mark.parametrize(
    ("code", "left"),
    [
        ("torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: None)", "module._global_forward_hooks: 0 -> 1"),
        ("torch.overrides.BaseTorchFunctionMode().__enter__()", "an active TorchFunctionMode: 0 -> 1"),
        # a thread that would wait for the run's data (issue 56, finding 7); it ends with the test's process
        ("import threading, time\nthreading.Thread(target=time.sleep, args=(5,), daemon=True).start()", "a running thread: "),
        ("import gc\ngc.callbacks.append(lambda phase, info: None)", "a gc callback: 0 -> 1"),
    ],
    ids=["forward_hook", "function_mode", "thread", "gc_callback"],
)
def test_a_plugin_that_leaves_a_global_torch_hook_behind_is_refused(
    plugin_folder: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, code: str, left: str
) -> None:
    (plugin_folder / "hooking.py").write_text(f"import torch\n{SMALL.format(name='hooking')}\n{code}\n")
    line = refused(capsys, tmp_path, "plugins=[hooking]", "attacks=[hooking]")
    try:
        assert line.startswith("fdattack: error: plugins: 'hooking' left process-wide state behind when imported (") and left in line
    finally:
        gc.callbacks[:] = [c for c in gc.callbacks if getattr(c, "__module__", None) != "hooking"]


def test_hooks_set_before_a_plugin_is_imported_are_not_blamed_on_it(plugin_folder: Path) -> None:
    """The check compares torch's state before and after the import: what the process had already stays its own."""
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: None)
    try:
        (plugin_folder / "innocent.py").write_text(SMALL.format(name="innocent"))
        load_plugins(["innocent"])
    finally:
        handle.remove()
    assert "innocent" in ATTACKS


def test_a_module_on_the_path_runs_with_the_plugins_key(plugin_folder: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """docs/plugins.md's module, not installed: plugins=[...] brings its attack into the config and a run, whose metrics
    are its scorer's; --help-config and a matrix file read the key too (each with a plugin of its own, loaded first
    there)."""
    (plugin_folder / "votes_plugin.py").write_text(VOTES)
    overrides = ["plugins=[votes_plugin]", "attacks=[myattack]", "protocol.rounds=1", "evaluation.classifier=null"]
    cfg = compose(None, tiny(tmp_path, *overrides, "attack.myattack.smoothing=0.5", "evaluation.confidence_gap.enabled=false"))
    assert list(cfg.plugins) == ["votes_plugin"] and cfg.attack.myattack.smoothing == 0.5
    metrics = run(cfg)
    assert math.isfinite(metrics["attack/myattack/kl"]) and metrics["attack/myattack/kl"] < metrics["attack/myattack/uniform_kl"] / 2
    with pytest.raises(ConfigError, match=r"^command line: plugins='votes_plugin' must be a list of importable module names"):
        compose(None, ["plugins=votes_plugin"])
    (plugin_folder / "help_plugin.py").write_text(SMALL.format(name="helped"))
    assert main(["run", "--help-config", "plugins=[help_plugin]"]) == 0
    assert "attack.helped (attacks=[helped]" in capsys.readouterr().out
    (plugin_folder / "matrix_plugin.py").write_text(SMALL.format(name="in_matrix"))
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(
        "name: m\noverrides: ['plugins=[matrix_plugin]']\nseeds: [0]\ndata: {digits: []}\nprotocols: {fedmd: []}\n"
        "defenses: {none: []}\nattacks: [in_matrix]\n"
    )
    assert load_matrix(matrix).attacks == ("in_matrix",)


def test_a_plugin_is_loaded_once_however_often_it_is_named(plugin_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module named by two entry points and by the plugins key is loaded and checked once, though what it registers
    lives in a module it imports; one imported before it was named counts what it defines as its own; an entry point
    that does not import is one line naming it."""
    (plugin_folder / "bundle.py").write_text("import bundle_part  # registers the attack\n")
    (plugin_folder / "bundle_part.py").write_text(SMALL.format(name="bundled"))
    points = [EntryPoint("bundle", "bundle", group) for group in ("fdattack.attacks", "fdattack.defenses")]
    monkeypatch.setattr(plugins, "entry_points", lambda group: [p for p in points if p.group == group])
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_LOADED", False)
    assert "attack.bundled (attacks=[bundled]" in help_config()  # the registries load the entry points when first used
    load_plugins(["bundle"])
    load_plugins(["bundle"])
    assert loaded_plugins() == ("bundle",) and "bundled" in ATTACKS
    (plugin_folder / "early.py").write_text(SMALL.format(name="early"))
    importlib.import_module("early")
    load_plugins(["early"])
    assert loaded_plugins() == ("bundle", "early")
    points.append(EntryPoint("gone", "no_such_plugin_module:Attack", "fdattack.attacks"))
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_LOADED", False)
    with pytest.raises(ConfigError, match=r"^entry point fdattack.attacks: gone = no_such_plugin_module:Attack does not import: Module"):
        load_plugins()


def test_an_isolated_run_imports_its_plugins_from_where_the_run_does(plugin_folder: Path, tmp_path: Path) -> None:
    """Issue 57: a plugin on the run's path (not on ``PYTHONPATH``) did not import in the workers, which stopped every
    attack, built-ins included, and the run exited 0 without an attack metric."""
    (plugin_folder / "votes_plugin.py").write_text(VOTES)
    overrides = ["plugins=[votes_plugin]", "attacks=[myattack,ldia]", "protocol.rounds=1", "evaluation.classifier=null"]
    metrics = run(compose(None, tiny(tmp_path, *overrides, "evaluation.confidence_gap.enabled=false", "isolation.mode=process")))
    assert math.isfinite(metrics["attack/myattack/kl"]) and math.isfinite(metrics["attack/ldia/kl"])
    assert not [key for key in metrics if "/stopped/" in key]


def test_a_plugin_that_imports_in_the_run_but_not_in_a_worker_is_one_line_before_any_round(
    plugin_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its import reads a file beside it, which a confined worker may not: the attacks' declarations, read in such a
    worker before the first round, fail with one line naming it (exit 2), and no run directory is left."""
    (plugin_folder / "setting.txt").write_text("x")
    reading = 'from pathlib import Path\n\nSETTING = (Path(__file__).parent / "setting.txt").read_text()\n'
    (plugin_folder / "wobbly_plugin.py").write_text(reading + SMALL.format(name="wobbly"))
    overrides = ["plugins=[wobbly_plugin]", "attacks=[wobbly,ldia]", "protocol.rounds=1", "isolation.mode=process"]
    assert main(["run", *tiny(tmp_path, *overrides)]) == 2
    line = error_of(capsys.readouterr().err)
    assert "the attacks' declarations could not be read" in line and "'wobbly_plugin' does not import: PermissionError" in line
    assert not (tmp_path / "run").exists()
