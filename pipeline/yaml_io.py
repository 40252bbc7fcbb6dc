"""Strict YAML for settings files: duplicate keys, alias bombs, runaway nesting and
undecodable bytes are errors that name the file, the line and the fix."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.error import MarkedYAMLError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from mentor.pipeline.errors import ConfigError

# A settings file is small: more values than this (counted with every alias expanded, long
# strings by their length) or deeper nesting is an error, so an alias bomb ("billion
# laughs") fails at once instead of expanding into gigabytes when the settings are
# validated, hashed or saved.
YAML_MAX_NODES = 100_000
YAML_MAX_DEPTH = 100


def _strict_yaml_loader():
    """A yaml.SafeLoader that rejects duplicate keys, alias bombs and runaway nesting."""
    class StrictLoader(yaml.SafeLoader):
        def __init__(self, stream):
            super().__init__(stream)
            self._sizes: dict[int, int] = {}
            self._depth = 0

        def compose_node(self, parent, index):
            self._depth += 1
            try:
                if self._depth > YAML_MAX_DEPTH:
                    raise MarkedYAMLError(None, None, f"nested deeper than {YAML_MAX_DEPTH} levels", self.peek_event().start_mark)
                if self.check_event(AliasEvent):
                    anchor = self.peek_event().anchor
                    target = self.anchors.get(anchor)
                    if target is not None and id(target) not in self._sizes:
                        raise MarkedYAMLError(None, None, f"the alias *{anchor} refers to a value that contains it (recursive alias)",
                                              self.peek_event().start_mark)
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
            key = id(node)
            if key not in self._sizes:
                if isinstance(node, ScalarNode):
                    size = 1 + len(node.value) // 64  # long strings weigh more: an alias copies them whole
                elif isinstance(node, SequenceNode):
                    size = 1 + sum(self._size(c) for c in node.value)
                elif isinstance(node, MappingNode):
                    size = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
                else:  # pragma: no cover
                    size = 1
                self._sizes[key] = size
                if size > YAML_MAX_NODES:
                    raise MarkedYAMLError(
                        None, None, f"expands to more than {YAML_MAX_NODES:,} values through aliases (*name); "
                        "write the values out instead of nesting aliases", node.start_mark,
                    )
            return node

        def _size(self, node) -> int:
            return self._sizes[id(node)]

        def construct_mapping(self, node, deep=False):
            if isinstance(node, MappingNode):
                seen: dict = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, ScalarNode):
                        continue
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        first = seen.get(key)
                    except TypeError:  # an unhashable key: SafeConstructor rejects it itself
                        continue
                    if first is not None:
                        raise ConstructorError(None, None, f"duplicate key {key!r} (first at line {first}); keep one", key_node.start_mark)
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def load_yaml_text(text: str):
    """Parse YAML settings with `_strict_yaml_loader`; raises yaml.YAMLError."""
    loader = _strict_yaml_loader()(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml_mapping(path: str | os.PathLike, what: str = "settings") -> dict[str, Any]:
    """A YAML file that must hold a mapping; `ConfigError` naming the file otherwise.

    Duplicate keys, alias bombs, runaway nesting and undecodable bytes are errors too.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); save it as UTF-8") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from exc
    try:
        data = load_yaml_text(text) or {}
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        detail = exc.problem or str(exc)
        if exc.context and "duplicate key" not in detail:
            detail = f"{exc.context}, {detail}"
        raise ConfigError(f"{path}: {where}not valid YAML: {detail}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of {what}, found {type(data).__name__}")
    return data


__all__ = ["load_yaml_text", "read_yaml_mapping"]
