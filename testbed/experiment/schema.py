"""A small declarative schema for experiment files: each option is declared once, as a field
of a section dataclass, and parsing, validation, the settings objects and the reference page
all come from that declaration.

A section is a frozen dataclass whose fields are made with :func:`option` (default, help, unit,
accepted words, a check), listed in a :class:`Section` with the YAML mapping it reads (several
sections may share one mapping: ``ocs:`` carries scheduling, timing and device access). The
field's type annotation is its type (``int``, ``float``, ``bool``, ``str``, ``list``, ``Any``,
unions with ``None``). :func:`parse_sections` reads a document's mappings with positions (unknown
keys refused, each value typed and checked); :func:`check_values` checks settings made in code
(``RunSettings.replace``) by the same rules; :func:`reference_markdown` writes the reference
page (``docs/config-reference.md``, :mod:`testbed.experiment.reference`).

Values are checked in this order: a word of ``words`` (``auto`` -> None), else a custom
``parse`` (it types and checks the whole value), else the type, then ``choices``, then
``check`` (it returns why a typed value is refused, or None). Every refusal is a ``ValueError``
whose message the caller places: at the key's ``file:line:column`` when parsing, at the key
and the file when checking.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from workloads.yamldoc import TYPE_WORDS, YamlDoc

_OPTION = "schema.option"
_NONE = type(None)
_WORDS = {**TYPE_WORDS, list: "a list", _NONE: "null"}


@dataclass(frozen=True)
class Option:
    """What :func:`option` declares besides the default: see its arguments."""

    help: str
    key: str = ""
    unit: str = ""
    choices: tuple[str, ...] = ()
    words: Mapping[str, Any] = field(default_factory=dict)
    parse: Callable[[Any], Any] | None = None
    check: Callable[[Any], str | None] | None = None
    type_text: str = ""
    default_text: str = ""
    manifest: bool = True


def option(default: Any, help: str, *, key: str = "", unit: str = "",
           choices: tuple[str, ...] = (), words: Mapping[str, Any] | None = None,
           parse: Callable[[Any], Any] | None = None,
           check: Callable[[Any], str | None] | None = None, type_text: str = "",
           default_text: str = "", manifest: bool = True) -> Any:
    """A dataclass field that is an option of its section.

    ``key``: its YAML key (default: the field's name); ``unit``: of the number, for the page;
    ``choices``: the strings it accepts; ``words``: YAML words that stand for a stored value
    (``{"auto": None}``); ``parse``: a whole-value parser (returns the stored value or raises
    ``ValueError``) instead of the type check; ``check``: why a typed value is refused, or None;
    ``type_text`` / ``default_text``: how the page words its type / default when the annotation
    / the value do not say it; ``manifest``: whether ``to_json`` (the run's manifest) has it.
    """
    meta = Option(help, key, unit, choices, dict(words or {}), parse, check, type_text,
                  default_text, manifest)
    return field(default=default, metadata={_OPTION: meta})


@dataclass(frozen=True)
class Section:
    """A group of options: its dataclass, the YAML mapping it reads ("": the top level) and
    what it is about (a sentence for the page)."""

    name: str
    cls: type
    yaml: str
    help: str


@dataclass(frozen=True)
class Spec:
    """One option, resolved: its section, settings field name, declaration, accepted types and
    default."""

    section: Section
    name: str
    option: Option
    kinds: tuple[type, ...]
    default: Any

    @property
    def key(self) -> str:
        return self.option.key or self.name

    @property
    def path(self) -> str:
        """The dotted YAML path, as errors name it (``ocs.semantics``)."""
        return f"{self.section.yaml}.{self.key}" if self.section.yaml else self.key

    def coerce(self, value: Any) -> Any:
        """The stored value of ``value`` (as written in a file or given in code), or a
        ``ValueError`` saying what is accepted."""
        opt = self.option
        if isinstance(value, str) and value in opt.words:
            return opt.words[value]
        if opt.parse is not None:
            return opt.parse(value)
        try:
            value = _typed(value, self.kinds)
        except ValueError as exc:
            if not opt.words:
                raise
            words = " or ".join(repr(w) for w in opt.words)
            raise ValueError(str(exc).replace(", got", f" or {words}, got", 1)) from None
        if opt.choices and value not in opt.choices:
            raise ValueError(f"must be one of {', '.join(opt.choices)}, got {value!r}")
        why = opt.check(value) if opt.check is not None and value is not None else None
        if why:
            raise ValueError(why)
        return value

    def type_text(self) -> str:
        """The type, in words, for the page."""
        if self.option.type_text:
            return self.option.type_text
        if self.option.choices:
            return " \\| ".join(f"`{c}`" for c in self.option.choices)
        words = [_WORDS.get(k, "any") for k in self.kinds if k is not _NONE]
        words += [f"`{w}`" for w in self.option.words]
        if _NONE in self.kinds and None not in self.option.words.values():
            words.append("null")
        return " or ".join(words) or "any"

    def default_text(self) -> str:
        """The default, in words, for the page."""
        if self.option.default_text:
            return self.option.default_text
        value = self.default
        named = [w for w, v in self.option.words.items() if v == value and type(v) is type(value)]
        if named:
            return f"`{named[0]}`"
        if value is None:
            return "null (absent)"
        if isinstance(value, bool):
            return f"`{str(value).lower()}`"
        return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def _kinds(hint: Any) -> tuple[type, ...]:
    """The types a field's annotation accepts (``Any``: none named, anything goes)."""
    if hint is Any:
        return ()
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(k for arg in typing.get_args(hint) for k in _kinds(arg))
    origin = typing.get_origin(hint)
    return (origin if origin is not None else hint,)


def _typed(value: Any, kinds: tuple[type, ...]) -> Any:
    """``value`` if one of ``kinds`` takes it (an int is a float, a bool is no int)."""
    if not kinds:
        return value
    if value is None and _NONE in kinds:
        return None
    for kind in kinds:
        if kind is bool:
            if isinstance(value, bool):
                return value
        elif isinstance(value, bool):
            continue
        elif kind is float and isinstance(value, int | float):
            return float(value)
        elif kind is not _NONE and isinstance(value, kind):
            return value
    words = " or ".join(_WORDS.get(k, k.__name__) for k in kinds)
    raise ValueError(f"must be {words}, got {value!r}")


def specs_of(section: Section) -> list[Spec]:
    """The options of ``section``, in declaration order."""
    hints = typing.get_type_hints(section.cls)
    return [Spec(section, f.name, f.metadata[_OPTION], _kinds(hints[f.name]), f.default)
            for f in dataclasses.fields(section.cls) if _OPTION in f.metadata]


def all_specs(sections: tuple[Section, ...]) -> list[Spec]:
    """Every option of ``sections``; a field name or a YAML path declared twice is refused."""
    out = [s for section in sections for s in specs_of(section)]
    for attr in ("name", "path"):
        seen: set[str] = set()
        for s in out:
            value = getattr(s, attr)
            if value in seen:
                raise TypeError(f"config schema: {attr} {value!r} declared twice")
            seen.add(value)
    return out


def mappings(specs: list[Spec]) -> dict[str, list[Spec]]:
    """The options by the YAML mapping they are read from ("": the top level)."""
    out: dict[str, list[Spec]] = {}
    for s in specs:
        out.setdefault(s.section.yaml, []).append(s)
    return out


def parse_sections(doc: YamlDoc, top: dict[str, Any], specs: list[Spec]) -> dict[str, Any]:
    """The settings fields that document ``doc`` (top-level mapping ``top``) sets, by field
    name; a mapping's unknown key, a value of another type or a refused value is an error at
    its position. (The top level's keys are checked by the workload loader, which owns most of
    them.)"""
    out: dict[str, Any] = {}
    for name, group in mappings(specs).items():
        data = top if not name else doc.mapping(top.get(name, {}), name,
                                                tuple(s.key for s in group))
        for s in group:
            if s.key in data:
                try:
                    out[s.name] = s.coerce(data[s.key])
                except ValueError as exc:
                    raise doc.error(s.path, str(exc)) from exc
    return out


def check_values(settings: object, specs: list[Spec]) -> Iterator[tuple[Spec, str]]:
    """(option, why) for each value of ``settings`` (an object with the fields) refused."""
    for s in specs:
        try:
            s.coerce(getattr(settings, s.name))
        except ValueError as exc:
            yield s, str(exc)


def reference_markdown(sections: tuple[Section, ...], intro: str) -> str:
    """The reference page: ``intro``, then per section its sentence and a table of its
    options (YAML key, type, default, unit, meaning)."""
    lines = [intro.strip(), ""]
    for section in sections:
        where = f"`{section.yaml}:`" if section.yaml else "the top level"
        lines += [f"## {section.name}", "", f"{section.help.strip()} (YAML: {where})", "",
                  "| key | type | default | unit | meaning |", "|---|---|---|---|---|"]
        for s in specs_of(section):
            help_text = " ".join(s.option.help.split()).replace("|", "\\|")
            lines.append(f"| `{s.path}` | {s.type_text()} | {s.default_text()} | "
                         f"{s.option.unit} | {help_text} |")
        lines.append("")
    return "\n".join(lines)
