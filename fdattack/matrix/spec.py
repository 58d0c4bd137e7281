"""A matrix file: which data, protocols, defenses, attacks and seeds the leakage matrix crosses.

.. code-block:: yaml

    name: small                  # the W&B group and the default folder runs/matrix/<name>
    experiment: null             # an experiment YAML every cell starts from (null: the embedded default)
    overrides: [protocol.rounds=3]            # for every cell
    seeds: [0, 1, 2]
    data:      {digits: [data=digits], mnist: [data=mnist_pdafd]}
    protocols: {fedmd: [protocol=fedmd], dsfl: [protocol=dsfl]}
    defenses:
      none: []
      laplace_0.5: ["defenses=[laplace]", defense.laplace.scale=0.5]
      topk:                      # a curve: one setting per strength, named topk_1, topk_3
        overrides: ["defenses=[topk]"]
        strengths: {defense.topk.k: [1, 3]}
    attacks:   [pli, tbi, ldia, lira_distill]
    skip: [mnist/dsfl/*, "att_faces/*/*/lira_*"]   # cells not to run (data/protocol/defense), or attacks left out of
                                                   # cells (data/protocol/defense/attack); each part a shell pattern
    control: {mnist_gan: [protocol.optim.lr=1.0e-12]}  # per data setting, the overrides of its control run
    margins: {accuracy: 0.05}    # the equivalence margin δ of a headline metric (defaults: fdattack.statistics.verdicts)
    decide: {max_seeds: 10, batch: 2, budget_minutes: 120}   # --decide: seeds until decided (fdattack.matrix.decide)

Each axis maps a setting's name (it names folders and table rows) to the overrides that make it, the tokens of
``fdattack run``; an ``experiment=PATH`` token among them sets the experiment file the cell starts from. A defense
may instead be a curve, its overrides and one key's strengths: it stands for one setting per strength, named
``<defense>_<strength>`` with ``<key>=<strength>`` added (:class:`Curve`). The attacks are not an axis: every attack
whose needs the cell's protocol and data offer runs on the cell's one simulation.

``control`` adds a setting named ``control`` to the defenses of each data setting it names: the undefended simulation
with the control's overrides instead, in which nothing of the clients' private data reaches what the protocol sends
(the clients' learning rate at 1e-12: their networks stay at their initialisation). What an attack scores there is what
it gets without the protocol's data, the baseline its leak is measured against (:mod:`fdattack.matrix.answer`).
``margins`` sets, before the run, how close to its baseline an attack must be shown to be to count as stopped.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fdattack.config.composition import load_named_plugins
from fdattack.config.registries import registries
from fdattack.config.schema import SEED_MAX
from fdattack.config.yaml_files import quote, read_yaml_file
from fdattack.errors import ConfigError
from fdattack.matrix.decide import Design, design_of
from fdattack.statistics.verdicts import MARGINS

#: the axes a matrix crosses, in the order of a cell's folder ``<data>/<protocol>/<defense>``
AXES = ("data", "protocols", "defenses")
KEYS = ("name", "experiment", "overrides", "seeds", *AXES, "attacks", "skip", "control", "margins", "decide")
#: the defense setting of a data setting's control run (``control:``)
CONTROL = "control"
#: a setting's name: it names a folder and a W&B run
PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


@dataclass(frozen=True)
class Curve:
    """A defense given at several strengths: the settings it stands for, weakest-listed first.

    Attributes:
        key: the config key the strengths set (``defense.laplace.scale``).
        settings: (setting name, strength) per strength, in the file's order.
    """

    key: str
    settings: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class MatrixSpec:
    """A parsed, checked matrix file (see the module docstring); ``source`` is the file it came from."""

    name: str
    experiment: Path | None
    overrides: tuple[str, ...]
    seeds: tuple[int, ...]
    data: dict[str, tuple[str, ...]]
    protocols: dict[str, tuple[str, ...]]
    defenses: dict[str, tuple[str, ...]]
    attacks: tuple[str, ...]
    source: Path
    skip: tuple[str, ...] = ()
    curves: dict[str, Curve] = field(default_factory=dict)
    control: dict[str, tuple[str, ...]] = field(default_factory=dict)
    margins: dict[str, float] = field(default_factory=dict)
    decide: Design | None = None  # ``decide:``; None: the defaults at these seeds

    def design(self) -> Design:
        """The sequential design of ``--decide``."""
        return self.decide or Design(self.seeds)

    def defense_overrides(self, data: str, defense: str) -> tuple[str, ...] | None:
        """The overrides of ``defense`` in ``data``: the control's where ``defense`` is :data:`CONTROL` (None where
        ``data`` has no control run)."""
        if defense == CONTROL:
            return self.control.get(data)
        return self.defenses[defense]

    def skipped(self, data: str, protocol: str, defense: str, attack: str | None = None) -> str | None:
        """The ``skip`` pattern that leaves out this cell (a three-part pattern), or, given an ``attack``, this attack in
        it (a four-part one); None where none does."""
        parts = (data, protocol, defense) if attack is None else (data, protocol, defense, attack)
        return next(
            (
                p
                for p in self.skip
                if p.count("/") == len(parts) - 1 and all(fnmatch.fnmatchcase(n, q) for n, q in zip(parts, p.split("/")))
            ),
            None,
        )


#: keys the matrix sets itself (the seeds from ``seeds:``, the folders from ``--root``): an override of them is refused
MATRIX_SET_KEYS = ("seed", "seeds", "output_dir", "resume")
#: the folder under the root of the networks every cell of a data setting and seed shares (``cache_dir``)
CACHE_FOLDER = "cache"
#: what the matrix writes beside the data folders under its root: no data setting may take these names
ROOT_OUTPUTS = ("matrix.json", "matrix.csv", "page", "wandb", CACHE_FOLDER)


def _tokens(path: Path, key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, str) and "=" in t for t in value):
        raise ConfigError(f"{path}: {key} must be a list of key=value or group=name overrides, got {quote(repr(value))}")
    for token in value:
        if token.split("=", 1)[0] in MATRIX_SET_KEYS:
            raise ConfigError(
                f"{path}: {key}: {token} would be ignored: the matrix sets seed and seeds from its seeds: key, "
                "output_dir and resume from --root"
            )
    return tuple(value)


def _axis(path: Path, key: str, value: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"{path}: {key} must map at least one setting's name to its overrides, e.g. {key}: {{name: [key=value]}}")
    for name in value:
        if not isinstance(name, str) or not PLAIN.match(name):
            raise ConfigError(
                f"{path}: {key}: {name!r} is not a plain name (letters, digits, and _ . + - after the first); it names a folder"
            )
        if key == "data" and name in ROOT_OUTPUTS:
            raise ConfigError(f"{path}: data: {name!r} is a name the matrix's own outputs take ({', '.join(ROOT_OUTPUTS)}); rename it")
    return {name: _tokens(path, f"{key}.{name}", overrides) for name, overrides in value.items()}


def _defenses(path: Path, value: Any) -> tuple[dict[str, tuple[str, ...]], dict[str, Curve]]:
    """The defenses axis with each curve expanded to its settings in place, and the curves by name."""
    if not isinstance(value, dict) or not value or not any(isinstance(v, dict) for v in value.values()):
        return _axis(path, "defenses", value), {}
    settings: dict[str, tuple[str, ...]] = {}
    curves: dict[str, Curve] = {}
    for name, given in value.items():
        if not isinstance(given, dict):
            settings.update(_axis(path, "defenses", {name: given}))
            continue
        where = f"{path}: defenses.{name}"
        if set(given) != {"overrides", "strengths"}:
            raise ConfigError(f"{where}: a curve has exactly the keys overrides and strengths, got {', '.join(map(str, given))}")
        strengths = given["strengths"]
        if not isinstance(strengths, dict) or len(strengths) != 1 or not isinstance(next(iter(strengths)), str):
            raise ConfigError(f"{where}.strengths must map one config key to its values, e.g. {{defense.laplace.scale: [0.5, 1, 2]}}")
        ((key, values),) = strengths.items()
        if not isinstance(values, list) or len(values) < 2 or not all(_number(v) for v in values) or len(set(values)) != len(values):
            raise ConfigError(f"{where}.strengths.{key} must list two or more distinct numbers, got {quote(repr(values))}")
        base = _axis(path, "defenses", {name: given["overrides"]})[name]
        _check_curve_key(where, key, base)
        points = []
        for strength in values:
            setting = f"{name}_{strength:g}"
            if setting in value or setting in settings:
                raise ConfigError(f"{where}: its setting {setting!r} (strength {strength:g}) is also a defense of its own; rename one")
            settings[setting] = _tokens(path, f"defenses.{name}", [*base, f"{key}={strength}"])
            points.append((setting, float(strength)))
        curves[name] = Curve(key, tuple(points))
    return settings, curves


def _check_curve_key(where: str, key: str, overrides: tuple[str, ...]) -> None:
    """A curve over ``defense.<name>.<knob>`` must enable that defense in its overrides (``defenses=[...]``): else every
    strength gives the same run, plotted as a curve.

    Raises:
        ConfigError: naming the curve, its key and the defenses it enables.
    """
    parts = key.split(".")
    if len(parts) < 3 or parts[0] != "defense":
        return
    given = [o.split("=", 1)[1] for o in overrides if o.replace(" ", "").startswith("defenses=")]
    enabled = [d.strip() for d in given[-1].strip().strip("[]").split(",") if d.strip()] if given else []
    if parts[1] not in enabled:
        raise ConfigError(
            f"{where}: its strengths set {key}, but its overrides enable {', '.join(enabled) or 'no defense'}: every strength "
            f"would give the same run; add {parts[1]} to its defenses=[...] or set a key of a defense it enables"
        )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _seeds(path: Path, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        raise ConfigError(f"{path}: seeds must be a non-empty list of integers, got {quote(repr(value))}")
    if len(set(value)) != len(value) or not all(0 <= s <= SEED_MAX for s in value):
        raise ConfigError(f"{path}: seeds={value}: each seed once, each in 0..{SEED_MAX}")
    return tuple(value)


def _attacks(path: Path, value: Any) -> tuple[str, ...]:
    _, attacks, _ = registries()
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        raise ConfigError(f"{path}: attacks must be a non-empty list of attack names; choose from: {', '.join(attacks.names())}")
    for name in value:
        if name not in attacks.names():
            raise ConfigError(f"{path}: attacks: {name!r} is not a known attack; choose from: {', '.join(attacks.names())}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{path}: attacks={value}: an attack is listed twice")
    return tuple(value)


def _skip(path: Path, value: Any, axes: list[dict[str, tuple[str, ...]]], attacks: tuple[str, ...]) -> tuple[str, ...]:
    """The ``skip`` patterns, each of which must leave out at least one cell (or attack) of the product (a typo or an
    unclosed ``[`` would otherwise leave out nothing, silently)."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(p, str) and p.count("/") in (2, 3) for p in value):
        raise ConfigError(
            f"{path}: skip must be a list of data/protocol/defense patterns (e.g. mnist/fedavg/*), or data/protocol/defense/attack "
            f"patterns (e.g. att_faces/*/*/lira_*), got {quote(repr(value))}"
        )
    names = [*axes, {attack: () for attack in attacks}]
    for pattern in value:
        parts = zip((*AXES, "attacks"), names, pattern.split("/"))
        unmatched = [(key, part) for key, axis, part in parts if not any(fnmatch.fnmatchcase(n, part) for n in axis)]
        if unmatched:
            key, part = unmatched[0]
            listed = ", ".join(names[(*AXES, "attacks").index(key)])
            raise ConfigError(f"{path}: skip: {pattern!r} leaves out nothing: {part!r} matches none of {key} ({listed})")
    return tuple(value)


def _control(path: Path, value: Any, data: dict[str, tuple[str, ...]], defenses: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The control runs' overrides by data setting; each named data setting must exist, and no defense may be named
    :data:`CONTROL`."""
    if value is None:
        return {}
    if CONTROL in defenses:
        raise ConfigError(f"{path}: defenses: {CONTROL!r} is the name of the control runs (control:); rename that defense")
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"{path}: control must map data settings to their control run's overrides, e.g. control: {{mnist: [key=value]}}")
    unknown = [name for name in value if name not in data]
    if unknown:
        raise ConfigError(f"{path}: control: {unknown[0]!r} is not a data setting (data: {', '.join(data)})")
    return {name: _tokens(path, f"control.{name}", overrides) for name, overrides in value.items()}


def _margins(path: Path, value: Any) -> dict[str, float]:
    """The equivalence margins by headline metric name, each a positive number."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: margins must map headline metrics ({', '.join(MARGINS)}) to positive numbers")
    for name, margin in value.items():
        if name not in MARGINS:
            raise ConfigError(f"{path}: margins: {name!r} is not a headline metric with a margin; choose from: {', '.join(MARGINS)}")
        if not _number(margin) or not margin > 0:
            raise ConfigError(f"{path}: margins.{name}={quote(repr(margin))} must be a positive number")
    return {name: float(margin) for name, margin in value.items()}


def load_matrix(path: Path) -> MatrixSpec:
    """Read and check a matrix file.

    Raises:
        ConfigError: one line naming the file, the key and what is allowed (the overrides themselves are checked when
            the cells are composed, :func:`fdattack.matrix.plan.plan_cells`).
    """
    raw = read_yaml_file(path, "matrix file")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a matrix file is a mapping with keys {', '.join(KEYS)}")
    for key in raw:
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), KEYS, n=1)
            raise ConfigError(f"{path}: unknown key {key!r}{f'; did you mean {close[0]!r}?' if close else ''} (keys: {', '.join(KEYS)})")
    missing = [key for key in ("name", "seeds", *AXES, "attacks") if key not in raw]
    if missing:
        raise ConfigError(f"{path}: missing {', '.join(missing)} (keys: {', '.join(KEYS)})")
    name = raw["name"]
    if not isinstance(name, str) or not PLAIN.match(name):
        raise ConfigError(f"{path}: name={quote(repr(name))} must be a plain name (it names the W&B group and the folder)")
    experiment = raw.get("experiment")
    if experiment is not None and not isinstance(experiment, str):
        raise ConfigError(f"{path}: experiment must be the path of an experiment YAML, got {quote(repr(experiment))}")
    data, protocols = (_axis(path, key, raw[key]) for key in AXES[:2])
    defenses, curves = _defenses(path, raw["defenses"])
    overrides = _tokens(path, "overrides", raw.get("overrides"))
    try:  # plugins=[...] in the experiment or the overrides: their attacks may be among attacks
        load_named_plugins(experiment or None, list(overrides))
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    attacks = _attacks(path, raw["attacks"])
    seeds = _seeds(path, raw["seeds"])
    control = _control(path, raw.get("control"), data, defenses)
    if control:
        defenses = {**defenses, CONTROL: ()}
    return MatrixSpec(
        name=name,
        experiment=Path(experiment) if experiment else None,
        overrides=overrides,
        seeds=seeds,
        data=data,
        protocols=protocols,
        defenses=defenses,
        attacks=attacks,
        source=path,
        skip=_skip(path, raw.get("skip"), [data, protocols, defenses], attacks),
        curves=curves,
        control=control,
        margins=_margins(path, raw.get("margins")),
        decide=design_of(seeds, raw.get("decide"), str(path)),
    )
