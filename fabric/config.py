"""Validated reading of YAML/JSON configuration documents.

One idea: every value is read through a :class:`Reader` that knows the source file and the dotted
path of the field it is reading, so any refusal can name the file, the field, what was wrong and
what is allowed (see :class:`fabric.errors.ConfigError`). Unknown keys are refused too: a typo in a
field name must not silently fall back to a default.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable, Mapping

import yaml

from orchestrl.fabric.errors import ConfigError

__all__ = ["Reader", "load_document", "parse_yaml", "json_without_duplicates"]

_MISSING = object()


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads YAML 1.2 floats such as ``2.9e10`` (YAML 1.1 wants ``2.9e+10``).

    Sizes in bytes are naturally written ``2.9e10``; PyYAML would load that as a *string* and a
    user would get a confusing type error, so accept it as the number everyone means.

    A key given twice in one mapping is refused: YAML would keep the last one silently, so
    ``stage: train`` followed by ``stage: gen`` would plan a generation period.
    """

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # merge keys (<<) may legitimately repeat what they merge
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: the base constructor reports it
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found key {key!r} twice (first on line {first.line + 1}); give each key once",
                        key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def json_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for :func:`json.loads` that refuses a key given twice in one object."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one object; give each key once")
        out[key] = value
    return out


def parse_yaml(text: str):
    """Parse YAML text with the project's loader (YAML 1.2-style floats)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


def load_document(path: str | os.PathLike[str]) -> "Reader":
    """Return a :class:`Reader` over the mapping stored in a YAML or JSON file.

    Raises
    ------
    ConfigError
        If the file is missing, unreadable, not valid YAML/JSON, or its top level is not a mapping.
    """
    source = os.fspath(path)
    try:
        with open(source, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise ConfigError(source, "<file>", "file does not exist", "a path to a YAML or JSON file") from None
    except OSError as exc:
        raise ConfigError(source, "<file>", f"cannot be read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError(source, "<file>", f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line})",
                          "save the file as UTF-8") from None
    try:
        data = (json.loads(text, object_pairs_hook=json_without_duplicates) if source.endswith(".json")
                else parse_yaml(text))
    except (yaml.YAMLError, ValueError) as exc:
        raise ConfigError(source, "<file>", f"is not valid {'JSON' if source.endswith('.json') else 'YAML'}: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(source, "<top level>", f"expected a mapping, got {type(data).__name__}", "a mapping of fields")
    return Reader(data, source)


class Reader:
    """Typed, path-tracking access to one mapping of a configuration document.

    Examples
    --------
    >>> r = Reader({"pods": {"count": 2}}, "fab.yaml")
    >>> r.section("pods").int("count", minimum=1)
    2
    >>> r.section("pods").int("servers", default=4)
    4
    """

    def __init__(self, data: Mapping[str, Any], source: str, path: str = "") -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(source, path or "<top level>", f"expected a mapping, got {type(data).__name__}", "a mapping of fields")
        self.data = data
        self.source = source
        self.path = path
        self._read: set[str] = set()

    # -- plumbing ---------------------------------------------------------------------------
    def field_path(self, key: str | int) -> str:
        """Return the dotted path of ``key`` under this reader."""
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str | int, problem: str, allowed: str = "") -> ConfigError:
        """Return (not raise) a :class:`ConfigError` about ``key`` under this reader."""
        return ConfigError(self.source, self.field_path(key), problem, allowed)

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        self._read.add(key)
        if key not in self.data or self.data[key] is None:
            if default is _MISSING:
                raise self.error(key, "is required but missing")
            return default
        return self.data[key]

    def reject_unknown(self, allowed: Iterable[str]) -> None:
        """Refuse keys outside ``allowed`` (catches typos that would otherwise be ignored)."""
        allowed = set(allowed)
        for key in self.data:
            if key not in allowed:
                raise self.error(str(key), "is not a known field", ", ".join(sorted(allowed)))

    # -- typed getters ----------------------------------------------------------------------
    def section(self, key: str, default: Mapping[str, Any] | None = None) -> "Reader":
        value = self.raw(key, _MISSING if default is None else default)
        if not isinstance(value, Mapping):
            raise self.error(key, f"expected a mapping, got {type(value).__name__}", "a mapping of fields")
        return Reader(value, self.source, self.field_path(key))

    def items(self, key: str, default: list[Any] | None = None) -> list[tuple[str, Any]]:
        """Return ``(path, value)`` for each element of a list field."""
        value = self.raw(key, _MISSING if default is None else default)
        if not isinstance(value, list):
            raise self.error(key, f"expected a list, got {type(value).__name__}", "a YAML list")
        base = self.field_path(key)
        return [(f"{base}[{i}]", v) for i, v in enumerate(value)]

    def sections(self, key: str, default: list[Any] | None = None) -> list["Reader"]:
        out = []
        for path, value in self.items(key, default):
            if not isinstance(value, Mapping):
                raise ConfigError(self.source, path, f"expected a mapping, got {type(value).__name__}", "a mapping of fields")
            out.append(Reader(value, self.source, path))
        return out

    def str(self, key: str, default: Any = _MISSING, choices: Iterable[str] | None = None) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {value!r}")
        if choices is not None:
            choices = list(choices)
            if value not in choices:
                raise self.error(key, f"unknown value {value!r}", ", ".join(choices))
        return value

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {value!r}", "true, false")
        return value

    def int(self, key: str, default: Any = _MISSING, minimum: int | None = None, maximum: int | None = None) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer, got {value!r}", _range_text(minimum, maximum, "an integer"))
        _check_range(self, key, value, minimum, maximum)
        return value

    def float(self, key: str, default: Any = _MISSING, minimum: float | None = None, maximum: float | None = None,
              exclusive_minimum: bool = False) -> float:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"expected a number, got {value!r}", _range_text(minimum, maximum, "a number"))
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise self.error(key, f"expected a finite number, got {value!r}", "a finite number")
        if exclusive_minimum and minimum is not None and value <= minimum:
            raise self.error(key, f"must be greater than {minimum:g}, got {value:g}", f"a number > {minimum:g}")
        _check_range(self, key, value, None if exclusive_minimum else minimum, maximum)
        return value


def _range_text(minimum: Any, maximum: Any, noun: str) -> str:
    if minimum is not None and maximum is not None:
        return f"{noun} from {minimum} to {maximum}"
    if minimum is not None:
        return f"{noun} >= {minimum}"
    if maximum is not None:
        return f"{noun} <= {maximum}"
    return noun


def _check_range(reader: Reader, key: str, value: float, minimum: Any, maximum: Any) -> None:
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise reader.error(key, f"value {value} is out of range", _range_text(minimum, maximum, "a value"))
