"""A YAML document that remembers where every value came from, and the checks every experiment
file's parser shares: a mapping with allowed keys, a typed scalar, a validated config object.

Every error is a :class:`~workloads.errors.WorkloadConfigError` naming the dotted key and its
``file:line:column``. The node tree is composed (not just loaded), so each value keeps its mark;
a mapping's key keeps its own under ``path#key`` (an unknown key is reported where it is
written). Used by :mod:`workloads.loader`, :mod:`testbed.experiment.schema` and the experiment
parsers built on them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, Protocol, TypeVar

import yaml

from workloads.errors import WorkloadConfigError

#: how a type is named in messages
TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
_TYPES = {int: int, float: float, bool: bool, str: str, "int": int, "float": float,
          "bool": bool, "str": str}


class _Validating(Protocol):
    def validate(self) -> None: ...


Config = TypeVar("Config", bound=_Validating)
Parsed = TypeVar("Parsed")


class YamlDoc:
    """A composed YAML document: values by dotted path, and their marks."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.marks: dict[str, yaml.Mark] = {}
        try:
            loader = yaml.SafeLoader(text)
            try:
                node = loader.get_single_node()
                self.loader = loader
                self.root = self._value(node, "") if node is not None else None
            finally:
                loader.dispose()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark
            pos = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
            raise WorkloadConfigError(f"invalid YAML: {exc.problem}", "", pos) from exc

    def _value(self, node: yaml.Node, path: str) -> Any:
        self.marks[path] = node.start_mark
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = self.loader.construct_object(key_node)
                sub = f"{path}.{key}" if path else str(key)
                if key in out:
                    raise WorkloadConfigError("duplicate key", sub, self.pos_of_mark(
                        key_node.start_mark))
                out[key] = self._value(value_node, sub)
                self.marks.setdefault(f"{sub}#key", key_node.start_mark)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self._value(v, f"{path}[{i}]") for i, v in enumerate(node.value)]
        return self.loader.construct_object(node)

    def pos_of_mark(self, mark: yaml.Mark) -> str:
        return f"{self.source}:{mark.line + 1}:{mark.column + 1}"

    def pos(self, path: str) -> str:
        """Position of ``path``, or of its closest ancestor present in the file."""
        while path:
            if path in self.marks:
                return self.pos_of_mark(self.marks[path])
            path = path.rsplit(".", 1)[0] if "." in path else ""
        return self.pos_of_mark(self.marks[""]) if "" in self.marks else self.source

    def key_pos(self, path: str) -> str:
        """Position of the key of ``path`` (where a mapping entry starts), else of its value."""
        mark = self.marks.get(f"{path}#key")
        return self.pos_of_mark(mark) if mark is not None else self.pos(path)

    def error(self, path: str, message: str) -> WorkloadConfigError:
        return WorkloadConfigError(message, path, self.pos(path))

    def mapping(self, value: Any, path: str, allowed: tuple[str, ...] | None) -> dict:
        """``value`` if it is a mapping whose keys are all ``allowed`` (None: any)."""
        if not isinstance(value, dict):
            raise self.error(path, "must be a mapping")
        if allowed is not None:
            for key in value:
                if key not in allowed:
                    sub = f"{path}.{key}" if path else str(key)
                    raise WorkloadConfigError(
                        f"unknown key {key!r}; allowed: {', '.join(allowed)}", sub,
                        self.key_pos(sub))
        return value

    def typed(self, value: Any, path: str, kind: type) -> Any:
        """``value`` if it is of ``kind`` (an int is a float; a bool is no int)."""
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if kind is int and isinstance(value, bool):
            raise self.error(path, f"must be an integer, got {value!r}")
        if not isinstance(value, kind):
            raise self.error(path, f"must be {TYPE_WORDS[kind]}, got {value!r}")
        return value

    def fields_of(self, cls: type, data: dict, path: str) -> dict[str, Any]:
        """Typed keyword arguments of dataclass ``cls`` from a mapping (unknown keys
        rejected)."""
        spec = {f.name: f for f in fields(cls)}
        self.mapping(data, path, tuple(spec))
        out: dict[str, Any] = {}
        for key, value in data.items():
            sub = f"{path}.{key}"
            type_name = str(spec[key].type).replace(" ", "")
            if value is None and "None" in type_name:
                out[key] = None
                continue
            base = type_name.split("|")[0]
            out[key] = self.typed(value, sub, _TYPES.get(base, str))
        return out

    def validated(self, cfg: Config) -> Config:
        """``cfg`` once its ``validate()`` passes; a refusal names the key's position here."""
        try:
            cfg.validate()
        except WorkloadConfigError as exc:
            raise self.error(exc.field, exc.reason) from exc
        return cfg


def load_file(path: str | Path, parse: Callable[[str, str, Path], Parsed],
              error: type[WorkloadConfigError] = WorkloadConfigError) -> Parsed:
    """``parse(text, file name, folder)`` of the file at ``path``; ``error`` if it is
    unreadable."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise error(f"cannot read {p}: {exc.strerror}", "", str(p)) from exc
    return parse(text, str(p), p.parent)
