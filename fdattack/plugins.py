"""Attacks, defenses and protocols from other packages: entry points and the ``plugins`` key (docs/plugins.md).

A plugin is a module whose import registers components through the registries' decorators
(``@ATTACKS.register("name")``, ``@DEFENSES.register``, ``@PROTOCOLS.register``). Two ways bring one in, the way
pytest finds its plugins:

- an installed package declares an entry point in one of :data:`ENTRY_POINT_GROUPS`
  (``[project.entry-points."fdattack.attacks"] myattack = "fdattack_myattack"``); every such entry point is loaded
  once per process, the first time the registries are used;
- the run-wide key ``plugins: [mypkg.attack]`` names modules to import, for modules not installed as a package; the
  config composition reads it before anything else (:func:`fdattack.config.composition.load_named_plugins`).

Each module is checked as it is imported, each failure one line (:class:`~fdattack.errors.ConfigError`): it must
import, register at least one new component, each with its ``Settings`` dataclass, take no name already registered,
and leave no process-wide torch hook or mode, thread, trace function or gc callback behind (module-level code runs in the
run's own process, before any data is loaded; an attack's run-time code is what ``isolation.mode=process`` confines,
where a worker imports its plugins once confined). Importing this module costs nothing; :func:`load_plugins` imports
the registries.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import importlib.util
import os
import re
import sys
import threading
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Callable, Sequence

from fdattack.errors import ConfigError

#: the entry-point groups searched, one per registry
ENTRY_POINT_GROUPS = ("fdattack.attacks", "fdattack.defenses", "fdattack.protocols")
#: Registry.register's refusal of a name taken: ``attack 'pli' is registered twice``
TAKEN = re.compile(r"^(?P<kind>\w+) '(?P<name>[^']+)' is registered twice$")

#: module name -> what its import registered (kind, name: ``("attack", "myattack")``), for every plugin module loaded in
#: this process
_LOADED: dict[str, tuple[tuple[str, str], ...]] = {}
_ENTRY_POINTS_LOADED = False


def load_plugins(modules: Sequence[str] = ()) -> None:
    """Load every installed entry point (once per process), then import ``modules`` (each once per process).

    What a worker process calls to see the same components as the run (``load_plugins(cfg.plugins)``).

    Raises:
        ConfigError: one line naming the module (or entry point) that does not import, registers nothing (or a component
            without its ``Settings`` dataclass), takes a name already registered, or leaves a process-wide torch hook or
            mode behind.
    """
    global _ENTRY_POINTS_LOADED
    if not _ENTRY_POINTS_LOADED:
        for point in _entry_points():
            where = f"entry point {point.group}: {point.name} = {point.value}{_distribution(point)}"
            _load(point.module, where, point.load)
        _ENTRY_POINTS_LOADED = True
    for module in modules:
        _load(module, f"plugins: {module!r}", lambda name=module: importlib.import_module(name))


def plugin_sources(modules: Sequence[str] = ()) -> list[Path]:
    """Where the plugins :func:`load_plugins` would import live (each top-level package's folder, or a lone module's
    file, and each entry point's metadata folder), found without importing any: what a worker confined before it imports
    them must be able to read."""
    points = _entry_points()
    tops = {point.module.partition(".")[0] for point in points} | {module.partition(".")[0] for module in modules}
    found = [Path(where) for where in (getattr(getattr(point, "dist", None), "_path", None) for point in points) if where]
    for top in sorted(tops):
        spec = importlib.util.find_spec(top)
        if spec is None:
            continue
        if spec.submodule_search_locations:
            found.extend(Path(location) for location in spec.submodule_search_locations)
        elif spec.origin:
            found.append(Path(spec.origin))
    return found


def plugin_roots(modules: Sequence[str]) -> list[Path]:
    """The folders from which this process imports ``modules`` (the ``sys.path`` entry holding each one's top-level
    package or lone module), found without importing any: where a worker's Python must look to import them too (a
    module in the run's working folder, say, which ``python -m fdattack`` finds and a worker started elsewhere would not)."""
    roots: list[Path] = []
    for top in dict.fromkeys(module.partition(".")[0] for module in modules):
        spec = importlib.util.find_spec(top)
        if spec is None:
            continue
        places = [Path(p) for p in spec.submodule_search_locations or []] or ([Path(spec.origin)] if spec.origin else [])
        roots.extend(place.parent for place in places if place.parent not in roots)
    return roots


def loaded_plugins() -> tuple[str, ...]:
    """The plugin modules this process has loaded, entry points' and the ``plugins`` key's, in load order."""
    return tuple(_LOADED)


def plugin_components(kind: str) -> frozenset[str]:
    """The names of the components of ``kind`` (``attack``, ``defense``, ``protocol``) that the plugins loaded in this
    process registered."""
    return frozenset(name for registered in _LOADED.values() for component, name in registered if component == kind)


def check_module_name(name: Any) -> str:
    """``name`` if it is an absolute dotted module name (``mypkg.attack``).

    Raises:
        ConfigError: ``plugins: 'mypkg/attack.py' is not a module name ...``
    """
    if not isinstance(name, str) or not name or not all(part.isidentifier() for part in name.split(".")):
        raise ConfigError(f"plugins: {name!r} is not a module name; give importable modules, e.g. plugins=[mypkg.attack]")
    return name


def _entry_points() -> list[EntryPoint]:
    """The entry points of :data:`ENTRY_POINT_GROUPS`, each once (a distribution found twice on the path lists them twice)."""
    found: dict[tuple[str, str, str], EntryPoint] = {}
    for group in ENTRY_POINT_GROUPS:
        for point in entry_points(group=group):
            found.setdefault((point.group, point.name, point.value), point)
    return list(found.values())


def _distribution(point: EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return f" (from {dist.name} {dist.version})" if dist is not None else ""


def _load(module: str, where: str, load: Callable[[], object]) -> None:
    """Import ``module`` through ``load`` and check what it did; a module loaded before is not checked again."""
    if module in _LOADED:
        return
    registries = _registries()
    before = _entries(registries)
    state_before = _process_state()
    try:
        load()
    except ValueError as err:
        taken = TAKEN.match(str(err))
        if taken is None:
            raise ConfigError(f"{where} does not import: {_first_line(err)}") from None
        owner = _owner(registries, taken.group("kind"), taken.group("name"))
        raise ConfigError(
            f"{where} registers {taken.group('kind')} {taken.group('name')!r}, a name {owner} took already; rename it"
        ) from None
    except Exception as err:  # what a module's import raises is the module's: one line naming it
        raise ConfigError(f"{where} does not import: {_first_line(err)}") from None
    left = _left_behind(state_before, _process_state())
    if left:
        raise ConfigError(
            f"{where} left process-wide state behind when imported ({left}); a plugin's import may only register components "
            "(docs/plugins.md)"
        )
    own = sorted(
        (kind, name, obj) for kind, name, obj in _entries(registries) if (kind, name, obj) not in before or _defined_in(obj, module)
    )
    if not own:
        raise ConfigError(
            f"{where} registers no attack, defense or protocol (a plugin's import registers them with "
            "@ATTACKS.register, @DEFENSES.register or @PROTOCOLS.register)"
        )
    for kind, name, obj in own:
        if not dataclasses.is_dataclass(getattr(obj, "Settings", None)):
            raise ConfigError(
                f"{where} registers {kind} {name!r} without a Settings dataclass (the dataclass of its knobs; an empty @dataclass will do)"
            )
    _LOADED[module] = tuple((kind, name) for kind, name, _ in own)


def _registries() -> tuple[Any, ...]:
    from fdattack.attacks import ATTACKS
    from fdattack.defenses import DEFENSES
    from fdattack.fd.protocols import PROTOCOLS

    return ATTACKS, DEFENSES, PROTOCOLS


def _entries(registries: tuple[Any, ...]) -> set[tuple[str, str, Any]]:
    return {(registry.kind, name, obj) for registry in registries for name, obj in registry.items()}


def _defined_in(obj: Any, module: str) -> bool:
    """Whether ``obj`` comes from ``module`` or a submodule of it (a module imported before it was named a plugin)."""
    home = getattr(obj, "__module__", None) or ""
    return home == module or home.startswith(f"{module}.")


def _owner(registries: tuple[Any, ...], kind: str, name: str) -> str:
    registry = next((r for r in registries if r.kind == kind), None)
    home = getattr(registry.get(name), "__module__", None) if registry is not None and name in registry else None
    return home or "another module"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _process_state() -> dict[str, tuple[Any, ...]]:
    """Torch's process-wide hook tables (their handles' ids) and mode stacks, the process's threads, trace functions and gc
    callbacks, by where they live."""
    import torch
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer
    from torch.utils import _python_dispatch

    state: dict[str, tuple[Any, ...]] = {}
    for home, path in ((nn_module, "torch.nn.modules.module"), (optimizer, "torch.optim.optimizer")):
        for name, table in vars(home).items():
            if name.startswith("_global_") and isinstance(table, dict):
                state[f"{path}.{name}"] = tuple(table)
    state["an active TorchFunctionMode"] = tuple(map(id, torch.overrides._get_current_function_mode_stack()))
    state["an active TorchDispatchMode"] = tuple(map(id, _python_dispatch._get_current_dispatch_mode_stack()))
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    state["default saved-tensors hooks"] = tuple(map(id, hooks)) if hooks else ()
    state["a running thread"] = _threads()
    state["a trace or profile function"] = tuple(id(f) for f in (sys.gettrace(), sys.getprofile(), threading.gettrace()) if f is not None)
    state["a gc callback"] = tuple(map(id, gc.callbacks))
    return state


def _threads() -> tuple[Any, ...]:
    """The process's threads (the kernel's tasks where ``/proc`` lists them, else Python's): one started at import would
    run on after it, in the run unconfined and in a worker outside its sandbox where started before it."""
    try:
        return tuple(sorted(os.listdir("/proc/self/task")))
    except OSError:
        return tuple(sorted(t.ident or 0 for t in threading.enumerate()))


def _left_behind(before: dict[str, tuple[Any, ...]], after: dict[str, tuple[Any, ...]]) -> str:
    """The entries of ``after`` that ``before`` lacks, in words (``torch.nn.modules.module._global_forward_hooks: 0 -> 1``)."""
    changed = [where for where in after if set(after[where]) - set(before.get(where, ()))]
    return "; ".join(f"{where}: {len(before.get(where, ()))} -> {len(after[where])}" for where in changed)
