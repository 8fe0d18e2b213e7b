"""dict <-> google.protobuf.Struct. JSON has one number type, so Struct stores floats;
whole numbers come back as int (a replica count of 3 stays 3, not 3.0)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format, struct_pb2


def to_struct(value: dict[str, Any] | None) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    if value:
        json_format.ParseDict(value, s)
    return s


def from_struct(s: struct_pb2.Struct | None) -> dict[str, Any]:
    if s is None:
        return {}
    return ints(json_format.MessageToDict(s))  # type: ignore[no-any-return]


def ints(v: Any) -> Any:
    """Whole-number floats (as JSON numbers arrive from a Struct) back to int, recursively."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        return int(v)
    if isinstance(v, dict):
        return {k: ints(x) for k, x in v.items()}
    if isinstance(v, list):
        return [ints(x) for x in v]
    return v
