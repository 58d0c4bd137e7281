"""The config files fdattack ships inside its package (``fdattack/conf``, ``fdattack/sweeps``) and where a name is looked up.

An installed wheel holds the same files as a clone (whose ``conf/`` and ``sweeps/`` are links to them). A file is named
by its path or, from any folder, by its name: ``fdattack run pli_fedmd_digits``, ``fdattack matrix small``,
``fdattack sweep pli_tau_gamma``. A name is looked up beside the experiment file that names it, then in the working
folder's ``conf/`` (or ``sweeps/``), then in the package's, so a user's copy (``fdattack init``) wins over the shipped one.
"""

from __future__ import annotations

import difflib
import shutil
from importlib.resources import files
from pathlib import Path

from fdattack.errors import ConfigError

#: fdattack's own config tree and sweep files, found as package resources (a regular install is a plain folder)
PACKAGE_CONF_DIR = Path(str(files("fdattack").joinpath("conf")))
PACKAGE_SWEEPS_DIR = Path(str(files("fdattack").joinpath("sweeps")))


def is_plain_name(name: str) -> bool:
    """Whether ``name`` is one path component: not empty, not ``.`` or ``..``, without ``/`` or ``\\``."""
    return name not in ("", ".", "..") and not {"/", "\\", "\0"} & set(name)


def conf_dirs(experiment: Path | None = None) -> list[Path]:
    """Folders searched for group files, in turn: beside the experiment file (its own folder, and the config tree that
    holds it where it lies in an ``experiment/`` folder), ``./conf``, then the package's ``conf/``. An experiment file
    given by its path so finds its ``defaults:`` from any working folder."""
    beside = []
    if experiment is not None:
        beside = [experiment.parent, *([experiment.parent.parent] if experiment.parent.name == "experiment" else [])]
    dirs = [d.absolute() for d in (*beside, Path.cwd() / "conf", PACKAGE_CONF_DIR)]
    return [d for i, d in enumerate(dirs) if d.is_dir() and d not in dirs[:i]]


def sweep_dirs() -> list[Path]:
    """Folders searched for a sweep file given by name: ``./sweeps``, then the package's."""
    dirs = [(Path.cwd() / "sweeps").absolute(), PACKAGE_SWEEPS_DIR]
    return [d for i, d in enumerate(dirs) if d.is_dir() and d not in dirs[:i]]


def named_file(token: str | Path, folders: list[Path], what: str) -> Path:
    """The YAML file ``token`` names: a path as it is (its reader says what is wrong with it), or a plain name that is no
    file here (``small`` or ``small.yaml``) looked up in ``folders`` in turn.

    Raises:
        ConfigError: a plain name that none of ``folders`` holds; the line names the closest that they hold.
    """
    path = Path(token)
    if path.exists() or path.is_symlink() or not is_plain_name(str(token)):
        return path
    name = str(token).removesuffix(".yaml")
    found = next((folder / f"{name}.yaml" for folder in folders if (folder / f"{name}.yaml").is_file()), None)
    if found is not None:
        return found
    known = sorted({p.stem for folder in folders for p in folder.glob("*.yaml")})
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.5) or known[:5]
    listed = ", ".join(close) + (f" (of {len(known)}; `fdattack init` copies them all)" if len(known) > len(close) else "")
    raise ConfigError(f"{what} not found: {token} is neither a file nor a name of one; by name: {listed or 'none'}")


def experiment_file(token: str | Path) -> Path:
    """The experiment YAML of ``fdattack run TOKEN``: a path, or a name in ``./conf/experiment`` or the package's."""
    return named_file(token, [d / "experiment" for d in conf_dirs()], "experiment file")


def matrix_file(token: str | Path) -> Path:
    """The matrix YAML of ``fdattack matrix TOKEN``: a path, or a preset name (``small``) in ``./conf/matrix`` or the package's."""
    return named_file(token, [d / "matrix" for d in conf_dirs()], "matrix file")


def sweep_file(token: str | Path) -> Path:
    """The sweep YAML of ``fdattack sweep TOKEN``: a path, or a name (``pli_tau_gamma``) in ``./sweeps`` or the package's."""
    return named_file(token, sweep_dirs(), "sweep file")


def copy_packaged(folder: Path) -> tuple[list[Path], list[Path]]:
    """Copy the package's ``conf/`` and ``sweeps/`` into ``folder`` to edit (``fdattack init``); a file already there is
    kept as it is.

    Returns:
        The files written and the files kept, each relative to ``folder``.

    Raises:
        ConfigError: a file cannot be written there, in one line.
    """
    written: list[Path] = []
    kept: list[Path] = []
    for source_root, name in ((PACKAGE_CONF_DIR, "conf"), (PACKAGE_SWEEPS_DIR, "sweeps")):
        for source in sorted(source_root.rglob("*.yaml")):
            relative = Path(name) / source.relative_to(source_root)
            target = folder / relative
            if target.exists():
                kept.append(relative)
                continue
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
            except OSError as err:  # a file where a folder goes, no permission, a full disk: one line, what was copied kept
                raise ConfigError(
                    f"fdattack init: cannot write {target} ({err.strerror or err}); {len(written)} files copied before it"
                ) from None
            written.append(relative)
    return written, kept
