"""Validation of a composed config: every field's range, the registry names, what needs what.

Ranges live next to the fields (:func:`fdattack.config.knobs.knob`); choices are enums that OmegaConf
checks on merge. What is left here: names of components, checks across fields, and compatibility,
decided from the components' declarations (an attack's or defense's needs against the protocol's
offers, :class:`~fdattack.fd.threat.Capability`), never from lists of names.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from fdattack.config.composition import registries
from fdattack.config.knobs import check_ranges
from fdattack.errors import ConfigError
from fdattack.fd.threat import CAPABILITY_TEXT, Capability


def validate(cfg: DictConfig) -> None:
    """Check ranges, names and compatibility that types alone cannot express.

    Raises:
        ConfigError: the first offending key, its value and what is allowed.
    """
    check_ranges(cfg, "")
    d = cfg.data
    if d.root is not None and d.name not in ("digits", "synthetic") and not d.download and not Path(d.root).expanduser().is_dir():
        raise ConfigError(f"data.root={d.root!r}: folder not found (give the folder holding the {d.name} files, or data.download=true where torchvision can download it)")
    check_compatibility(cfg)


def _unique(key: str, names: list[str]) -> None:
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"{key}={names}: {', '.join(repeated)} listed twice")


def _missing(needs: frozenset[Capability], offers: frozenset[Capability]) -> list[Capability]:
    return sorted(needs - offers, key=lambda c: c.value)


def check_compatibility(cfg: DictConfig) -> None:
    """Every attack and defense gets what it declares it needs from the protocol as configured.

    Raises:
        ConfigError: ``attacks: pli needs a server model f_0 (server_model), which protocol.name=fedmd does not offer here; set protocol.server_model=true``
    """
    protocols, attacks, defenses = registries()
    protocol = protocols.get(cfg.protocol.name)
    offers = protocol.offers(cfg.protocol)
    _unique("attacks", list(cfg.attacks))
    _unique("defenses", list(cfg.defenses))
    for key, registry, names in (("attacks", attacks, cfg.attacks), ("defenses", defenses, cfg.defenses)):
        for name in names:
            component = registry.get(name)
            needs = component.required(OmegaConf.to_object(cfg.attack[name])) if key == "attacks" else component.needs
            missing = _missing(needs, offers)
            if missing:
                what = ", ".join(f"{CAPABILITY_TEXT[c]} ({c.value})" for c in missing)
                hints = [protocol.enable_hints[c] for c in missing if c in protocol.enable_hints]
                from_settings = key == "attacks" and not set(missing) & component.needs
                fix = (f"set {' '.join(hints)}" if hints else f"change attack.{name}.* (its settings ask for it)" if from_settings
                       else f"remove {name} from {key}")
                raise ConfigError(f"{key}: {name} needs {what}, which protocol.name={protocol.name} does not offer here; {fix}")
