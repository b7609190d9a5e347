"""One way to read the fields of a document that came from outside: a recipe, a lock, a release's
``release.json`` and ``backend_versions.json``, the archive's table of contents. Each value is checked as
it is read, and a bad one is one line that names the document, the field (``archive.parts[2].size``),
what it is and what it should be, raised as the error class the document's reader chose, with its fix::

    release.json: archive.parts[2].size is a string, not a whole number >= 0 (use a release.json the ...)

Hand-written rather than msgspec or pydantic, which validate a typed schema: the readers here check a
few fields each and then rules of their own (a part's name, a tag, a chunk inside its member), in the
order they read them; a schema library's message (``Expected `int`, got `str` - at `$.parts[2].size```)
still needs the file and the fix added, and the installer's environment would carry a compiled
dependency for what is about a hundred lines. Standard library only, for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Self, TypeVar, overload

from vllm_bundle.util.validate import SHA256_HEX

__all__ = ["JSON", "TOML", "Dialect", "Document", "Fields"]

T = TypeVar("T")
D = TypeVar("D")


class _Required:
    """The default of a field that must be there (``None`` may be a caller's default)."""


REQUIRED: Final = _Required()


@dataclass(frozen=True)
class Dialect:
    """How a document's language calls its kinds of value in a message ("a table" in TOML, "a JSON
    object" in JSON). ``kinds``: (type, name), a bool's before an int's (a bool is an int in Python)."""

    kinds: tuple[tuple[type | tuple[type, ...], str], ...]
    object_name: str
    objects_name: str

    def kind(self, value: object) -> str:
        """``value``'s kind as the language calls it: "a string", "an array", ..."""
        if value is None:
            return "null"
        return next((name for kind, name in self.kinds if isinstance(value, kind)), "a date or time")


_COMMON: Final = ((bool, "a boolean"),)
JSON: Final = Dialect(
    (*_COMMON, ((int, float), "a number"), (str, "a string"), (list, "an array"), (dict, "a JSON object")),
    "a JSON object",
    "JSON objects",
)
TOML: Final = Dialect(
    (*_COMMON, (int, "an integer"), (float, "a float"), (str, "a string"), (list, "an array"), (dict, "a table")),
    "a table",
    "tables",
)


@dataclass(frozen=True)
class Document:
    """Where fields come from: ``name`` (a path, an URL, an asset's name) begins every message, and
    ``error`` makes the exception a bad field is, from its one line (the reader's class and fix)."""

    name: str
    error: Callable[[str], Exception]
    dialect: Dialect = JSON

    def fields(self, value: object) -> Fields:
        """The document's top-level object."""
        return Fields(self, value, "")

    def problem(self, field: str, problem: str) -> Exception:
        """The error for ``field`` (a dotted path; empty for the whole document): ``<name>: <field> <problem>``
        (an empty ``name``: ``<field> <problem>``, for a reader whose caller names the document)."""
        line = f"{field or 'the document'} {problem}"
        return self.error(f"{self.name}: {line}" if self.name else line)


class Fields:
    """One object of a :class:`Document`, read a field at a time. ``path`` leads to it from the top."""

    def __init__(self, document: Document, value: object, path: str) -> None:
        self.document, self.path = document, path
        if not isinstance(value, dict):
            raise document.problem(path, f"is {document.dialect.kind(value)}, not {document.dialect.object_name}")
        self.data: dict[str, Any] = value

    def field(self, key: str) -> str:
        """The path of ``key`` from the top, as messages name it (``archive.parts[2]``, ``a.b``)."""
        return ".".join(part for part in (self.path, key) if part)

    def problem(self, key: str, problem: str) -> Exception:
        """The error for this object's ``key`` (a caller's own rule said no)."""
        return self.document.problem(self.field(key), problem)

    def bad(self, key: str, expected: str, value: object = REQUIRED) -> Exception:
        """The error for ``key``, whose value (``value``, else the one the object holds) breaks a rule of
        the caller's: ``... is '<value>', not <expected>``."""
        if isinstance(value, _Required):
            if key not in self.data:  # (not "is null": TOML has no null, and the document has no such key)
                return self.problem(key, f"is missing, and must be {expected}")
            value = self.data[key]
        return self.problem(key, f"is {self.shown(value)}, not {expected}")

    def shown(self, value: object) -> str:
        """``value`` as a message shows it: a number as written, a string quoted (cut to 80 characters),
        anything else by its kind ("an array")."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)[:40]
        return repr(value[:80]) if isinstance(value, str) else self.document.dialect.kind(value)

    def _child(self, value: object, path: str) -> Self:
        return type(self)(self.document, value, path)

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def value(self, key: str, kind: type[T], expected: str, default: D | _Required = REQUIRED) -> T | D:
        """``key``'s value if it is a ``kind`` (never a bool for an int), else the error naming it. With a
        ``default``, the field is optional: absent or JSON's null, it is ``default``."""
        if self.data.get(key) is None:
            if isinstance(default, _Required):
                raise self.problem(key, "is missing" if key not in self.data else f"is null, not {expected}")
            return default
        value = self.data[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            # Its kind ("is an array"); a fraction as written ("is 1.5, not a whole number", where JSON's
            # kind would say "is a number, not a whole number").
            shown = str(value)[:40] if isinstance(value, float) else self.document.dialect.kind(value)
            raise self.problem(key, f"is {shown}, not {expected}")
        return value

    @overload
    def text(self, key: str) -> str: ...
    @overload
    def text(self, key: str, default: D) -> str | D: ...
    def text(self, key: str, default: object = REQUIRED) -> object:
        """A string without NUL (no file name or header holds one). A required one is not empty (a field
        that must be there must say something); one with a default may be."""
        value = self.value(key, str, "a string", default)
        if isinstance(value, str) and "\0" in value:
            raise self.bad(key, "a string without NUL")
        if value == "" and isinstance(default, _Required):
            raise self.bad(key, "a non-empty string")
        return value

    @overload
    def whole(self, key: str, *, least: int = ..., unit: str = ...) -> int: ...
    @overload
    def whole(self, key: str, default: D, *, least: int = ..., unit: str = ...) -> int | D: ...
    def whole(self, key: str, default: object = REQUIRED, *, least: int = 0, unit: str = "") -> object:
        """A whole number ``>= least`` (``unit`` names what it counts, for the message: "bytes")."""
        expected = f"a whole number of {unit} >= {least}" if unit else f"a whole number >= {least}"
        value = self.value(key, int, expected, default)
        if isinstance(value, int) and value < least:
            raise self.bad(key, expected)
        return value

    def number(self, key: str) -> float:
        """A number above zero (a timeout, a ratio)."""
        value = self.value(key, int | float, "a positive number")  # type: ignore[arg-type]
        if value <= 0:
            raise self.bad(key, "a positive number")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        return self.value(key, bool, "true or false", default)

    @overload
    def sha256(self, key: str, *, prefix: str = ...) -> str: ...
    @overload
    def sha256(self, key: str, default: D, *, prefix: str = ...) -> str | D: ...
    def sha256(self, key: str, default: object = REQUIRED, *, prefix: str = "") -> object:
        """A sha256 in 64 lowercase hex digits after ``prefix`` (``sha256:``), returned without it. Digests
        name cache files, so nothing else gets through (``../x``, an absolute path, a number)."""
        expected = f"{prefix}<64 lowercase hex digits>" if prefix else "a sha256 (64 lowercase hex digits)"
        value = self.value(key, str, expected, default)
        if not isinstance(value, str):
            return value
        if not value.startswith(prefix) or not SHA256_HEX.fullmatch(value.removeprefix(prefix)):
            raise self.bad(key, expected)
        return value.removeprefix(prefix)

    def strings(self, key: str, default: tuple[str, ...] | None = None) -> tuple[str, ...]:
        """A non-empty array of non-empty strings."""
        if key not in self.data and default is not None:
            return default
        items = self.value(key, list, "a non-empty array of strings")
        if not items or not all(isinstance(item, str) and item and "\0" not in item for item in items):
            raise self.bad(key, "a non-empty array of non-empty strings")
        return tuple(items)

    def table(self, key: str, *, required: bool = True) -> Self:
        """The object under ``key``; absent (or null) and not ``required``, an empty one."""
        if self.data.get(key) is None and not required:
            return self._child({}, self.field(key))
        return self._child(self.data.get(key), self.field(key))

    def array(self, key: str, *, required: bool = True) -> list[Any]:
        """The array under ``key`` as it is (its items checked by the caller); absent and not required, []."""
        items: list[Any] = self.value(key, list, "an array", REQUIRED if required else [])
        return items

    def _objects(self, key: str, *, required: bool) -> list[Any]:
        expected = f"an array of {self.document.dialect.objects_name}"
        items: list[Any] = self.value(key, list, expected, REQUIRED if required else [])
        return items

    def tables(self, key: str, *, required: bool = True) -> list[Self]:
        """The array of objects under ``key``, each one a :class:`Fields`; absent and not required, none."""
        items = self._objects(key, required=required)
        return [self._child(item, self.field(f"{key}[{number}]")) for number, item in enumerate(items)]

    def texts(self) -> dict[str, str]:
        """Every key with its string (an object of strings: versions by component)."""
        return {key: self.text(key) for key in self.data}

    def items(self) -> Iterator[tuple[str, Self]]:
        """Every key with the object it holds (an object of objects: a table of targets, of tags)."""
        for key in self.data:
            yield key, self.table(key)
