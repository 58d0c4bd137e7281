"""Reading a user's YAML file (a sweep file, a matrix file) so that every fault is one line.

The file must be a readable UTF-8 file, valid YAML, and small once its aliases are written out: a few ``*name``
aliases can stand for billions of values (a "billion laughs" file), so a document whose aliases expand past
:data:`MAX_YAML_NODES` values is refused before it is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fdattack.errors import ConfigError

#: The most values a file may hold with its YAML aliases written out.
MAX_YAML_NODES = 10_000
#: The longest part of a message quoted from a YAML error or a schema violation (which quotes the offending value whole).
MAX_QUOTE = 300


def quote(text: str) -> str:
    """The first line of ``text``, cut to :data:`MAX_QUOTE` characters."""
    line = text.strip().partition("\n")[0]
    return line if len(line) <= MAX_QUOTE else line[: MAX_QUOTE - 3] + "..."


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """The nodes under ``node`` with every alias written out (at most ``MAX_YAML_NODES + 1``), counted once per shared
    node (``sizes``, by id); a node that holds itself counts as too many."""
    if id(node) in sizes:
        return sizes[id(node)]
    sizes[id(node)] = MAX_YAML_NODES + 1  # met again while counting it: a recursive alias
    if isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    else:
        children = node.value if isinstance(node, yaml.SequenceNode) else []
    sizes[id(node)] = min(1 + sum(_expanded_size(child, sizes) for child in children), MAX_YAML_NODES + 1)
    return sizes[id(node)]


def _first_repeated_key(node: yaml.Node, seen: set[int]) -> yaml.Node | None:
    """The first key that a mapping under ``node`` gives twice (YAML keeps the last silently), or None."""
    if id(node) in seen:
        return None
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        keys: set[str] = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode):
                if key.value in keys:
                    return key
                keys.add(key.value)
        children = [child for pair in node.value for child in pair]
    else:
        children = node.value if isinstance(node, yaml.SequenceNode) else []
    return next((found for child in children if (found := _first_repeated_key(child, seen)) is not None), None)


def _parse(path: Path, text: str, what: str) -> Any:
    """``yaml.safe_load`` that refuses a document whose aliases expand past :data:`MAX_YAML_NODES` values, and a mapping
    that gives a key twice."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and _expanded_size(node, {}) > MAX_YAML_NODES:
            raise ConfigError(f"{path}: more than {MAX_YAML_NODES} values once its YAML aliases (*name) are written out; not a {what}")
        repeated = _first_repeated_key(node, set()) if node is not None else None
        if repeated is not None:
            raise ConfigError(
                f"{path}, line {repeated.start_mark.line + 1}: {repeated.value!r} is given twice in one mapping (YAML would keep "
                "the last silently); give each key once"
            )
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml_file(path: Path, what: str) -> Any:
    """The YAML document in ``path`` (``what`` names the kind of file in messages: ``sweep file``, ``matrix file``).

    Raises:
        ConfigError: the file is missing, a folder, unreadable, not UTF-8, not YAML, nested too deeply, too large once
            its aliases are written out, or a mapping in it gives a key twice.
    """
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a folder; give the {what} itself")
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); save it as UTF-8") from None
    except OSError as err:
        raise ConfigError(f"{what} {path} cannot be read: {err.strerror or err}") from None
    try:
        return _parse(path, text, what)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({quote(str(err)) or type(err).__name__})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a {what}") from None
