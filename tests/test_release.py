"""What a user who installs a release reads: one version everywhere (``fdattack --version``, ``fdattack.__version__``,
the package's metadata, CHANGELOG.md's top entry), and a changelog that lists every key that moved."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import fdattack
from fdattack.cli import main
from fdattack.config.composition import MOVED_ATTACK_KEYS
from tests.conftest import REPO

CHANGELOG = (REPO / "CHANGELOG.md").read_text()


def test_one_version_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    top = re.search(r"^## (\d+\.\d+\.\d+) — \d{4}-\d{2}-\d{2}$", CHANGELOG, re.MULTILINE)
    assert top is not None, "CHANGELOG.md has no '## X.Y.Z — YYYY-MM-DD' entry"
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"fdattack {top.group(1)}"
    assert fdattack.__version__ == top.group(1) == version("fdattack")  # the installed metadata: pip install -e . again after a bump


def test_the_changelog_lists_every_moved_key() -> None:
    for key, attacks in MOVED_ATTACK_KEYS.items():
        leaf = "last_client_only" if key == "tbi_last_client_only" else key
        assert f"`attack.{key}`" in CHANGELOG, key
        for attack in attacks:
            assert f"`attack.{attack}.<key>`" in CHANGELOG or f"`attack.{attack}.{leaf}`" in CHANGELOG, (key, attack)


def test_without_the_sweeps_extra_a_sweep_file_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B's sweeps engine caps numpy below 2, so it is the ``sweeps`` extra, not a dependency of every install."""
    from fdattack.errors import ConfigError
    from fdattack.sweep import load_sweep

    (tmp_path / "sweep.yaml").write_text("method: grid\nparameters: {seed: {values: [0, 1]}}\n")
    monkeypatch.setitem(sys.modules, "sweeps", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"need W&B's sweeps engine, which is not installed: pip install 'fdattack\[sweeps\]'"):
        load_sweep(tmp_path / "sweep.yaml")


def test_without_the_dp_extra_dp_sgd_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """opacus is the ``dp`` extra: a run without DP-SGD needs none of it, one with DP-SGD is refused before it loads."""
    import subprocess

    from fdattack.config import compose
    from fdattack.errors import ConfigError

    fresh = "import sys; sys.modules['opacus'] = None; from fdattack.cli import main; sys.exit(main(['run', '--help-config']))"
    proc = subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0 and "defense.dpsgd.noise_multiplier" in proc.stdout, proc.stderr[-2000:]  # imports none of it
    monkeypatch.setitem(sys.modules, "opacus", None)  # as if not installed
    assert compose(None, ["attacks=[]"]).defenses == []
    with pytest.raises(ConfigError, match=r"^defenses=\[dpsgd\] trains with opacus, which is not installed: pip install 'fdattack\[dp\]'$"):
        compose(None, ["attacks=[]", "defenses=[dpsgd]"])


def test_the_package_declares_what_it_imports() -> None:
    """Every third-party module fdattack imports is a declared dependency (PyYAML was imported and not declared)."""
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[ ]", d)[0].lower() for d in declared["dependencies"]}
    optional = {re.split(r"[<>=\[ ]", d)[0].lower() for group in declared["optional-dependencies"].values() for d in group}
    module_of = {"pyyaml": "yaml", "scikit-learn": "sklearn", "pillow": "PIL"}
    imported = set()
    for path in (REPO / "fdattack").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m not in ("fdattack", "__future__")}
    provided = {module_of.get(n, n.replace("-", "_")) for n in names | optional}
    assert third_party <= provided | {"lightning_utilities"}, sorted(third_party - provided)


@pytest.mark.parametrize(
    ("data", "folder"), [("att_faces", "att_faces"), ("mnist_pdafd", "mnist_t10k"), ("mnist_fedinverse", "mnist_t10k")]
)
def test_the_data_lies_where_fdattack_data_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: str, folder: str) -> None:
    """From any folder: ``FDATTACK_DATA`` names where the data that is not downloaded lies; a missing folder is one line
    naming where that dataset comes from."""
    from fdattack.config import compose
    from fdattack.errors import ConfigError

    (tmp_path / folder).mkdir()
    monkeypatch.setenv("FDATTACK_DATA", str(tmp_path))
    assert compose(None, [f"data={data}", "attacks=[]"]).data.root == str(tmp_path / folder)
    monkeypatch.setenv("FDATTACK_DATA", str(tmp_path / "elsewhere"))
    with pytest.raises(ConfigError, match=rf"^data.root='{tmp_path / 'elsewhere' / folder}': folder not found; .*FDATTACK_DATA=<folder>"):
        compose(None, [f"data={data}", "attacks=[]"])


def test_an_experiment_file_finds_its_defaults_beside_it_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 58: an experiment file given by its path looked its ``defaults:`` up in ``./conf`` only (and in a clone's
    ``conf/``); a copy of the config tree elsewhere, run from an empty folder, now finds them beside it."""
    import shutil

    import yaml

    from fdattack.config import compose, packaged
    from fdattack.errors import ConfigError

    tree = tmp_path / "mine" / "conf"
    shutil.copytree(REPO / "conf", tree)
    digits = tree / "data" / "digits.yaml"
    digits.write_text(yaml.safe_dump({**yaml.safe_load(digits.read_text()), "max_per_class": 7}))  # its own copy is what is read
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    monkeypatch.setattr(packaged, "PACKAGE_CONF_DIR", tmp_path / "no-conf-here")
    cfg = compose(str(tree / "experiment" / "dsfl_digits.yaml"), [])
    assert cfg.protocol.name == "dsfl" and cfg.data.max_per_class == 7
    with pytest.raises(ConfigError, match=r"protocol='dsfl': no file conf/protocol/dsfl.yaml; available: none"):
        compose(None, ["protocol=dsfl"])  # no experiment file, no ./conf: nothing to find it in


def test_init_copies_the_shipped_files_once_and_says_in_one_line_where_it_cannot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fdattack.config.packaged import PACKAGE_CONF_DIR, PACKAGE_SWEEPS_DIR

    shipped = len(list(PACKAGE_CONF_DIR.rglob("*.yaml"))) + len(list(PACKAGE_SWEEPS_DIR.glob("*.yaml")))
    mine = tmp_path / "mine" / "conf" / "data" / "digits.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("name: digits\n")
    assert main(["init", str(tmp_path / "mine")]) == 0
    assert f"{shipped - 1} files in" in capsys.readouterr().out and mine.read_text() == "name: digits\n"  # its own copy kept
    (tmp_path / "a_file").write_text("")
    assert main(["init", str(tmp_path / "a_file")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fdattack: error: fdattack init: cannot write ") and len(err.splitlines()) == 1
