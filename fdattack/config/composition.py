"""Composition of a run config from the schemas, the registries, group files, the experiment and overrides.

A run's config is composed in this order, later layers winning:

1. the schema defaults (:mod:`fdattack.config.schema`; the embedded default is FedMD on scikit-learn's
   digits), with ``protocol`` from the chosen protocol's own dataclass, ``attack.<name>`` from every
   registered attack's settings and ``defense.<name>`` from every registered defense's;
2. group files named in the experiment's ``defaults:`` list, where a group token on the command line
   replaces the entry of its group (``protocol=dsfl`` loads ``conf/protocol/dsfl.yaml`` into the
   ``protocol`` node instead of the experiment's protocol file);
3. the experiment YAML's own keys;
4. ``key=value`` dotlist overrides (``attack.pli.tau=1``).

Before the schema is built, the modules that ``plugins`` names (the last layer that sets it wins) are imported and the
installed entry points loaded (:mod:`fdattack.plugins`), so that ``attack.<name>`` holds their components' settings.

A run without a ``name`` is named after its protocol, data and attacks (``dsfl_att_faces_pli-tbi``).

The schema is struct-mode: a misspelt key or a value of the wrong type is a :class:`ConfigError`
naming the key; a key of the old flat ``attack:`` layout names its new place.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fdattack.config.packaged import conf_dirs, experiment_file, is_plain_name
from fdattack.config.registries import registries
from fdattack.config.schema import ExperimentConfig
from fdattack.config.validation import validate
from fdattack.errors import ConfigError
from fdattack.plugins import check_module_name, load_plugins

GROUPS = ("data", "model", "protocol", "attack", "trainer", "logger")

#: keys of the flat ``attack:`` node before each attack had its own, and where they went
MOVED_ATTACK_KEYS = {
    **{key: ("pli", "tbi") for key in ("tau", "lr", "weight_decay", "batch_size", "epochs_per_round", "max_width")},
    **{key: ("pli",) for key in ("gamma", "alpha", "beta", "variant", "finetune", "prior")},
    "tbi_last_client_only": ("tbi",),
}


def settings_node(kind: str, entries: list[tuple[str, type]]) -> Any:
    """A dataclass instance with one field per registered component, each holding that component's settings."""
    fields = [(name, cls, dataclasses.field(default_factory=cls)) for name, cls in entries]
    return dataclasses.make_dataclass(f"{kind.capitalize()}Settings", fields)()


def schema_for(protocol_name: str) -> DictConfig:
    """The struct-mode schema of a run of ``protocol_name``, with every registered attack's and defense's settings.

    Building it from the dataclasses is most of a composition's time, so each schema is built once per protocol and
    set of registered components, and every call returns a copy of it.
    """
    protocols, attacks, defenses = registries()
    if protocol_name not in protocols:
        raise ConfigError(f"protocol.name={protocol_name!r} is not a known protocol; choose one of: {', '.join(protocols.names())}")
    components = (
        protocols.get(protocol_name).Settings,
        tuple((n, c.Settings) for n, c in attacks.items()),
        tuple((n, c.Settings) for n, c in defenses.items()),
    )
    key = (protocol_name, components)
    if key not in _SCHEMAS:
        root = ExperimentConfig(
            protocol=components[0](),
            attack=settings_node("attack", list(components[1])),
            defense=settings_node("defense", list(components[2])),
        )
        schema = OmegaConf.structured(root)
        OmegaConf.set_struct(schema, True)
        _SCHEMAS[key] = schema
    return copy.deepcopy(_SCHEMAS[key])


#: the schemas built so far, by protocol name and registered components (see :func:`schema_for`)
_SCHEMAS: dict[tuple[str, tuple[Any, ...]], DictConfig] = {}


def _omegaconf_error(err: OmegaConfBaseException, source: str, protocol_name: str) -> ConfigError:
    """Translate an OmegaConf error into one line naming the key."""
    key = str(getattr(err, "full_key", None) or getattr(err, "key", None) or "?")
    msg = str(err).splitlines()[0]
    if "not in" in msg or "Key '" in msg and "not" in msg:
        parent = key.rpartition(".")[0]
        hint = f" with protocol.name={protocol_name}" if parent == "protocol" else ""
        return ConfigError(
            f"{source}: unknown config key '{key}'{hint}"
            + (f" (see `fdattack run --help-config` for the keys under '{parent}')" if parent else "")
        )
    return ConfigError(f"{source}: {key}: {msg}")


def _load_yaml(path: Path, what: str) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"{what} file not found: {path}")
    try:
        loaded = OmegaConf.load(path)
    except Exception as err:  # yaml.YAMLError and OmegaConf errors alike
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{path}: must hold a mapping of config keys, not a {type(loaded).__name__}")
    if not loaded:
        raise ConfigError(f"{path}: {what} file is empty (no config keys); give it key: value lines, or leave it out for the defaults")
    return loaded


def _group_file(group: str, name: str, experiment: Path | None = None) -> Path:
    """``<group>/<name>.yaml`` from :func:`conf_dirs`; a name that is a path is refused (no YAML outside ``conf/``)."""
    plain = is_plain_name(name)
    for base in conf_dirs(experiment) if plain else []:
        candidate = base / group / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    available = ", ".join(sorted({p.stem for base in conf_dirs(experiment) for p in (base / group).glob("*.yaml")})) or "none"
    what = f"no file conf/{group}/{name}.yaml" if plain else f"a group token names a file in conf/{group}/, not a path"
    raise ConfigError(f"{group}={name!r}: {what}; available: {available}")


def _split_tokens(overrides: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Separate group tokens (``protocol=dsfl``) from dotlist value overrides."""
    groups: list[tuple[str, str]] = []
    dotlist: list[str] = []
    for token in overrides:
        if "=" not in token:
            raise ConfigError(f"override {token!r} is not of the form key=value")
        key, value = token.split("=", 1)
        if key in GROUPS and value and not value.startswith("{"):
            groups.append((key, value))
        else:
            dotlist.append(token)
    return groups, dotlist


def _from_dotlist(dotlist: list[str]) -> DictConfig:
    """The ``key=value`` tokens as a config; a value that is not YAML is refused naming its token."""
    try:
        for token in dotlist:
            try:
                OmegaConf.from_dotlist([token])
            except yaml.YAMLError as err:
                raise ConfigError(
                    f"command line: {token}: the value is not valid YAML ({' '.join(str(err).split())}); "
                    "a mapping needs a space after each colon, e.g. key={a: 1}"
                ) from None
        return OmegaConf.from_dotlist(dotlist)
    except OmegaConfBaseException as err:
        raise ConfigError(f"command line: {str(err).splitlines()[0]}") from None


def check_moved_keys(layer: DictConfig, source: str, attack_names: list[str]) -> None:
    """Refuse keys that have moved with a pointer to their new place: ``observers.*`` (now ``evaluation.*``) and the
    old flat ``attack.<knob>`` keys (now ``attack.<name>.<knob>``)."""
    observers = layer.get("observers") if isinstance(layer, DictConfig) else None
    if observers is not None:
        inner = next(iter(observers), None) if isinstance(observers, DictConfig) else None
        old = f"observers.{inner}" if inner is not None else "observers"
        new = f"evaluation.{inner}" if inner is not None else "evaluation.confidence_gap"
        raise ConfigError(f"{source}: {old} has moved to {new} (the diagnostics belong to the evaluation side)")
    node = layer.get("attack") if isinstance(layer, DictConfig) else None
    if not isinstance(node, DictConfig):
        return
    for key in node:
        key = str(key)
        if key in attack_names or key not in MOVED_ATTACK_KEYS:
            continue
        leaf = "last_client_only" if key == "tbi_last_client_only" else key
        new = " and ".join(f"attack.{name}.{leaf}" for name in MOVED_ATTACK_KEYS[key])
        raise ConfigError(f"{source}: attack.{key} has moved to {new} (each attack has its own knobs under attack.<name>)")


def _plugins_of(layers: list[tuple[str, DictConfig]]) -> list[str]:
    """The ``plugins`` list the composed config will hold: that of the last layer that sets it, its names checked."""
    chosen = next(((source, layer) for source, layer in reversed(layers) if "plugins" in layer), None)
    if chosen is None:
        return []
    source, layer = chosen
    value = layer.get("plugins")
    names = OmegaConf.to_container(value) if isinstance(value, ListConfig) else value
    if not isinstance(names, list):
        raise ConfigError(f"{source}: plugins={value!r} must be a list of importable module names, e.g. plugins=[mypkg.attack]")
    try:
        return [check_module_name(name) for name in names]
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def load_named_plugins(experiment: str | Path | None = None, overrides: list[str] | None = None) -> None:
    """Load the installed entry points and the plugins that the experiment YAML and the overrides name
    (``plugins=[mypkg.attack]``), as :func:`compose` does first: for callers that list the registered components before
    a run is composed (``--help-config``, a matrix file's attacks).

    Raises:
        ConfigError: a ``plugins`` value that is not a list of module names, or a plugin that fails its checks.
    """
    layers = [] if experiment is None else [(str(experiment), _load_yaml(experiment_file(experiment), "experiment"))]
    layers.append(("command line", _from_dotlist(_split_tokens(list(overrides or []))[1])))
    load_plugins(_plugins_of(layers))


def default_name(cfg: DictConfig) -> str:
    """``<protocol>_<data>[_<attack>-<attack>...]``, e.g. ``dsfl_att_faces_pli-tbi``: the name of a run that gives none."""
    return "_".join([str(cfg.protocol.name), str(cfg.data.name), *(["-".join(map(str, cfg.attacks))] if cfg.attacks else [])])


def compose(experiment: str | Path | None = None, overrides: list[str] | None = None) -> DictConfig:
    """Compose, type-check and range-check a run config.

    Args:
        experiment: an experiment YAML's path or name (``pli_fedmd_digits``, :func:`~fdattack.config.packaged.experiment_file`),
            or None for the embedded default.
        overrides: dotlist tokens ``key=value`` and group tokens ``group=name``.

    Returns:
        The resolved, validated, read-only config.

    Raises:
        ConfigError: naming the key or file that is wrong and what is allowed.
    """
    cfg = compose_unchecked(experiment, overrides)
    validate(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def compose_unchecked(experiment: str | Path | None = None, overrides: list[str] | None = None) -> DictConfig:
    """The config :func:`compose` composes, typed but before :func:`~fdattack.config.validation.validate` and writable:
    for callers that ask the validation's questions one by one (the leakage matrix: which attacks apply).

    Raises:
        ConfigError: an unknown key or group, a value of the wrong type, an experiment file that cannot be read.
    """
    overrides = list(overrides or [])
    group_tokens, dotlist = _split_tokens(overrides)
    layers: list[tuple[str, DictConfig]] = []
    exp_cfg: DictConfig | None = None
    exp_path = experiment_file(experiment) if experiment is not None else None
    selected: dict[str, str] = {}  # group -> file name: the experiment's defaults, replaced by group tokens
    if exp_path is not None:
        exp_cfg = _load_yaml(exp_path, "experiment")
        defaults = exp_cfg.pop("defaults", None)
        if defaults is not None:
            if (
                not isinstance(defaults, (DictConfig, ListConfig))
                or isinstance(defaults, ListConfig)
                and not all(isinstance(d, DictConfig) and len(d) == 1 for d in defaults)
            ):
                raise ConfigError(f"{exp_path}: 'defaults' must be a mapping group: name")
            items = defaults.items() if isinstance(defaults, DictConfig) else [next(iter(d.items())) for d in defaults]
            for group, name in items:
                if group not in GROUPS:
                    raise ConfigError(f"{exp_path}: defaults group {group!r} unknown; groups are {', '.join(GROUPS)}")
                selected[str(group)] = str(name)
    selected.update(group_tokens)
    for group, name in selected.items():
        path = _group_file(group, name, exp_path)
        layers.append((str(path), OmegaConf.create({group: _load_yaml(path, group)})))
    if exp_cfg is not None:
        layers.append((str(exp_path), exp_cfg))
    layers.append(("command line", _from_dotlist(dotlist)))

    load_plugins(_plugins_of(layers))  # the registries, and so the schema, hold the plugins' components from here on
    protocol_name = "fedmd"
    for _, layer in layers:
        name = OmegaConf.select(layer, "protocol.name", default=None)
        if name is not None:
            protocol_name = str(name)
    cfg = schema_for(protocol_name)
    attack_names = list(cfg.attack.keys())
    for source, layer in layers:
        check_moved_keys(layer, source, attack_names)
        try:
            cfg = OmegaConf.unsafe_merge(cfg, layer)  # cfg is this call's own copy: merged in place, not copied per layer
        except OmegaConfBaseException as err:
            raise _omegaconf_error(err, source, protocol_name) from None
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        raise _omegaconf_error(err, "config", protocol_name) from None
    seeded = [source for source, layer in layers if "seed" in layer]
    if cfg.seeds is not None and seeded:
        raise ConfigError(
            f"{seeded[-1]}: seed={cfg.seed} beside seeds={list(cfg.seeds)}: each replica's seed is one of seeds, so seed would be "
            "recorded and ignored; drop seed, or put it among seeds"
        )
    if cfg.name is None:
        cfg.name = default_name(cfg)
    if not is_plain_name(str(cfg.name)):
        raise ConfigError(
            f"name={cfg.name!r} must be a plain name without path separators (it names the run folder under runs/); "
            "choose the folder itself with output_dir=PATH"
        )
    return cfg


def load_config(experiment: str | Path | None = None, overrides: list[str] | None = None) -> DictConfig:
    """Notebook helper: the same composition as the CLI (``fdattack run EXPERIMENT k=v ...``)."""
    return compose(experiment, overrides)
