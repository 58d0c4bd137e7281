"""The version of the code that trains a cached artifact: a digest of its source files and of torch's version.

A cached network is valid only for the code that trained it: a changed training loop, network or objective must not
read back what the old one made (:mod:`fdattack.tracking.artifact_cache`). :func:`source_digest` names the code by the
bytes of the files that define it, so an edit anywhere in them, or another torch, trains anew.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from pathlib import Path

import torch


@functools.cache
def _file_digest(path: Path) -> str:
    return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()


def source_files(*sources: object) -> list[Path]:
    """The source files of ``sources``: a folder's or a package's ``*.py`` files (recursively), a module's, function's or
    class's own file."""
    files: set[Path] = set()
    for source in sources:
        if isinstance(source, Path):
            files.update(source.rglob("*.py") if source.is_dir() else [source])
        elif inspect.ismodule(source) and hasattr(source, "__path__"):  # a package: all of it
            files.update(p for folder in source.__path__ for p in Path(folder).rglob("*.py"))
        else:
            path = inspect.getsourcefile(source)  # type: ignore[arg-type]
            if path is None:
                raise TypeError(f"{source!r} has no source file")
            files.add(Path(path))
    return sorted(p.resolve() for p in files)


def source_digest(*sources: object) -> str:
    """A hex digest of the source files of ``sources`` (:func:`source_files`) and of torch's version."""
    h = hashlib.blake2b(f"torch {torch.__version__};".encode(), digest_size=16)
    for path in source_files(*sources):
        h.update(f"{path.name}:{_file_digest(path)};".encode())
    return h.hexdigest()
