"""The one reader of fields of a document from outside (util/fields.py): every reader's bad field is the
same kind of line, ``<document>: <field path> is <what it is>, not <what it should be>``, raised as the
reader's own error class with its fix. The readers' own tests (test_toc, test_bad_values, test_recipes,
test_install, test_probe) show each document's fields; these show the forms."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_bundle.errors import ManifestError
from vllm_bundle.util.fields import JSON, TOML, Document, Fields

SHA = "ab" * 32


def _fields(data: object, dialect: Any = JSON) -> Fields:
    return Document("doc.json", lambda message: ManifestError(message, "fix it"), dialect).fields(data)


def _refused(read: Any) -> str:
    with pytest.raises(ManifestError) as refused:
        read()
    assert refused.value.hint == "fix it"
    return refused.value.message


DOC: dict[str, Any] = {
    "name": "x",
    "empty": "",
    "count": 3,
    "parts": [{"size": 1}, {"size": -1}, {"size": 1.5}],
    "items": [{}, "p"],
    "nested": {"deeper": {"digest": "sha256:" + SHA}},
    "flag": True,
    "nothing": None,
    "nul": "a\0b",
}

REFUSALS = [
    ("missing", lambda f: f.text("absent"), "doc.json: absent is missing"),
    ("null where one is needed", lambda f: f.text("nothing"), "doc.json: nothing is null, not a string"),
    ("wrong kind", lambda f: f.text("count"), "doc.json: count is a number, not a string"),
    ("a bool is no number", lambda f: f.whole("flag"), "doc.json: flag is a boolean, not a whole number >= 0"),
    ("below the least", lambda f: f.tables("parts")[1].whole("size"), "parts[1].size is -1, not a whole number >= 0"),
    ("a fraction", lambda f: f.tables("parts")[2].whole("size"), "parts[2].size is 1.5, not a whole number >= 0"),
    ("an item not an object", lambda f: f.tables("items"), "doc.json: items[1] is a string, not a JSON object"),
    ("an empty required string", lambda f: f.text("empty"), "doc.json: empty is '', not a non-empty string"),
    ("a NUL", lambda f: f.text("nul"), "doc.json: nul is 'a\\x00b', not a string without NUL"),
    ("a digest without its prefix", lambda f: f.text("name") and f.sha256("name", prefix="sha256:"), "name is 'x'"),
    (
        "a caller's rule on a missing key",
        lambda f: f.bad("absent", "one of a, b"),
        "absent is missing, and must be one of",
    ),
    ("a caller's rule", lambda f: f.table("nested").bad("deeper", "gone"), "nested.deeper is a JSON object, not gone"),
    ("the document itself", lambda f: Document("d", lambda m: ManifestError(m, "fix it")).fields([]), "d: the"),
]


@pytest.mark.parametrize(("read", "message"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_each_bad_field_is_one_line_naming_the_document_and_the_field(read: Any, message: str) -> None:
    def attempt() -> None:
        result = read(_fields(DOC))
        if isinstance(result, Exception):  # bad() makes the error, the caller raises it
            raise result

    assert message in _refused(attempt)


def test_good_fields_are_read_and_optional_ones_have_their_default() -> None:
    fields = _fields(DOC)
    assert fields.text("name") == "x" and fields.text("empty", None) == ""
    assert fields.text("absent", None) is None and fields.text("nothing", "d") == "d"  # null: not given
    assert fields.whole("count", least=3) == 3 and fields.whole("absent", 7) == 7
    assert fields.table("nested").table("deeper").sha256("digest", prefix="sha256:") == SHA
    assert fields.table("absent", required=False).texts() == fields.table("nothing", required=False).texts() == {}
    assert "nothing is null, not a JSON object" in _refused(lambda: fields.table("nothing"))
    assert fields.tables("absent", required=False) == [] and fields.flag("flag", False) is True
    assert [part.path for part in _fields({"parts": [{}, {}]}).tables("parts")] == ["parts[0]", "parts[1]"]


def test_toml_names_its_kinds_as_toml_does() -> None:
    fields = _fields({"t": [1], "n": 5, "f": 0.5}, TOML)
    assert "t is an array, not a table" in _refused(lambda: fields.table("t"))
    assert "n is an integer, not a string" in _refused(lambda: fields.text("n"))
    assert "t is an array, not an array of tables" not in _refused(lambda: fields.tables("n"))
    assert "n is an integer, not an array of tables" in _refused(lambda: fields.tables("n"))
