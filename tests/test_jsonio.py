"""jsonio.copy_json: a deep copy of a JSON document."""

from __future__ import annotations


def test_copy_json_is_a_deep_copy() -> None:
    from mtpconv.jsonio import copy_json

    doc = {"a": [1, {"b": None, "c": 1.5}], "d": {"e": True, "f": "x"}}
    out = copy_json(doc)
    assert out == doc and out is not doc
    out["a"][1]["b"] = 2
    assert doc["a"][1]["b"] is None
