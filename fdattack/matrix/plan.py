"""The matrix's cells and what runs in each: one simulation per (data, protocol, defense) and seed, observed by every
attack whose needs the cell offers.

Applicability is decided from the declarations alone (:func:`fdattack.config.validation.unmet_needs`: an attack's or
defense's declared needs against the protocol's threat model and the data split's offers), never from a list of names:
a defense the protocol cannot take makes its whole cell n/a, an attack it cannot take is n/a in that cell, each with the
one-line reason.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from fdattack.config.composition import compose_unchecked
from fdattack.config.validation import check_names, unmet_needs, validate
from fdattack.errors import ConfigError
from fdattack.matrix.spec import MatrixSpec


@dataclass(frozen=True)
class Cell:
    """One (data, protocol, defense) setting of the matrix, run once per seed.

    Attributes:
        data, protocol, defense: the settings' names in the matrix file.
        overrides: the ``fdattack run`` tokens of its simulation (the matrix's, the three settings', its attacks).
        attacks: the matrix's attacks that run on it.
        not_applicable: attack name -> why it cannot run here.
        reason: why no simulation runs (a defense the protocol cannot take); None when it runs.
        experiment: the experiment YAML it starts from (an ``experiment=PATH`` token of its settings, else the matrix's).
    """

    data: str
    protocol: str
    defense: str
    overrides: tuple[str, ...] = ()
    attacks: tuple[str, ...] = ()
    not_applicable: dict[str, str] = field(default_factory=dict)
    reason: str | None = None
    experiment: Path | None = None

    @property
    def id(self) -> str:
        """``data/protocol/defense``: its folder under the matrix's root and its name in tables and W&B."""
        return f"{self.data}/{self.protocol}/{self.defense}"

    @property
    def runs(self) -> bool:
        return self.reason is None


def _experiment(spec: MatrixSpec, tokens: list[str]) -> tuple[Path | None, list[str]]:
    """The cell's experiment file (its settings' last ``experiment=PATH`` token, else the matrix's) and its other tokens."""
    chosen = [t.partition("=")[2] for t in tokens if t.startswith("experiment=")]
    return (Path(chosen[-1]) if chosen else spec.experiment), [t for t in tokens if not t.startswith("experiment=")]


def plan_cell(spec: MatrixSpec, data: str, protocol: str, defense: str) -> Cell:
    """The cell of these settings: its attacks and the reasons of those that do not apply.

    Raises:
        ConfigError: the settings' overrides do not compose, or the cell's config fails a check other than what
            attacks and defenses need (named with the cell).
    """
    where = f"{data}/{protocol}/{defense}"
    pattern = spec.skipped(data, protocol, defense)
    if pattern:
        return Cell(data, protocol, defense, reason=f"skipped by the matrix file ({pattern})")
    defended = spec.defense_overrides(data, defense)
    if defended is None:
        return Cell(data, protocol, defense, reason=f"the matrix file gives {data} no control run (control:)")
    experiment, base = _experiment(spec, [*spec.overrides, *spec.data[data], *spec.protocols[protocol], *defended])
    try:
        cfg = compose_unchecked(experiment, [*base, "attacks=[]"])
        check_names(cfg)
        blocked = next((r for r in (unmet_needs(cfg, "defenses", str(d)) for d in cfg.defenses) if r), None)
        if blocked:
            return Cell(data, protocol, defense, reason=blocked, experiment=experiment)
        not_applicable = {
            name: f"skipped by the matrix file ({p})" for name in spec.attacks if (p := spec.skipped(data, protocol, defense, name))
        }
        not_applicable |= {
            name: reason for name in spec.attacks if name not in not_applicable and (reason := unmet_needs(cfg, "attacks", name))
        }
        attacks = tuple(name for name in spec.attacks if name not in not_applicable)
        if not attacks:
            reason = "none of the matrix's attacks applies"
            return Cell(data, protocol, defense, not_applicable=not_applicable, reason=reason, experiment=experiment)
        overrides = (*base, f"attacks=[{','.join(attacks)}]")
        cfg.attacks = list(attacks)
        validate(cfg)  # the checks beyond needs (sizes, membership candidates, ...), as `fdattack run` makes them
    except ConfigError as err:
        raise ConfigError(f"{spec.source}: cell {where}: {err}") from None
    return Cell(data, protocol, defense, overrides, attacks, not_applicable, experiment=experiment)


def plan_cells(spec: MatrixSpec) -> list[Cell]:
    """Every cell of the matrix, data-major, in the order of the file."""
    return [plan_cell(spec, *names) for names in itertools.product(spec.data, spec.protocols, spec.defenses)]


def cell_folder(root: Path, cell: Cell) -> Path:
    """Where a cell's seeds and their aggregate live: ``<root>/<data>/<protocol>/<defense>``."""
    return root / cell.data / cell.protocol / cell.defense
