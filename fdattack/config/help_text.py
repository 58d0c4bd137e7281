"""``fdattack run --help-config``: every key with its default, meaning and range, from the dataclasses' fields."""

from __future__ import annotations

from fdattack.config.composition import GROUPS
from fdattack.config.registries import registries
from fdattack.config.schema import ExperimentConfig
from fdattack.fd.protocols.settings import ProtocolSettings
from fdattack.knobs import field_docs


def _section(title: str, rows: list[tuple[str, str, str]], width: int) -> list[str]:
    return ["", title] + [f"  {key:<{width}}{default:<12} {text}" for key, default, text in rows]


def help_config() -> str:
    """Every config key with its default and meaning, grouped by component."""
    protocols, attacks, defenses = registries()
    run_rows = field_docs(ExperimentConfig, "")
    base_rows = field_docs(ProtocolSettings, "protocol.")
    base_keys = set(base_rows)  # a protocol lists its own keys and the common ones whose default it changes
    protocol_rows = {
        name: [r for r in field_docs(cls.Settings, "protocol.") if r not in base_keys and r[0] != "protocol.name"]
        for name, cls in protocols.items()
    }
    attack_rows = {name: field_docs(cls.Settings, f"attack.{name}.") for name, cls in attacks.items()}
    defense_rows = {name: field_docs(cls.Settings, f"defense.{name}.") for name, cls in defenses.items()}
    every = run_rows + base_rows + [r for rows in (*protocol_rows.values(), *attack_rows.values(), *defense_rows.values()) for r in rows]
    width = max(len(key) for key, _, _ in every) + 2
    lines = ["Config keys (set with key=value; group files with group=name, groups: " + ", ".join(GROUPS) + "):"]
    lines += _section("run:", run_rows, width)
    lines += _section("protocol (every protocol):", base_rows, width)
    for name, rows in protocol_rows.items():
        lines += _section(f"protocol.name={name}:", rows, width)
    for name, rows in attack_rows.items():
        attack = attacks.get(name)
        needs = ", ".join(sorted(c.value for c in attack.required(attack.Settings())))
        lines += _section(f"attack.{name} (attacks=[{name}]; needs with these defaults: {needs or 'nothing'}):", rows, width)
    for name, rows in defense_rows.items():
        lines += _section(f"defense.{name} (defenses=[{name}]):", rows, width)
    return "\n".join(lines)
