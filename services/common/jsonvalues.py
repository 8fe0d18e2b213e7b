"""The JSON value rules of the input boundary: every JSON value a caller sends (run input and
output, event payloads, step results, tool parameters, compensation commands) arrives as a
google.protobuf.Struct and is checked here, once, before anything is written.

A value is accepted when it can be stored (Postgres jsonb) and returned by every RPC that
later returns it (a protobuf decoder's recursion limit, the gRPC message limit):

- numbers are finite (no NaN or Infinity: JSON has none, jsonb refuses them);
- no U+0000 in keys or strings (jsonb refuses it);
- keys and strings are Unicode text: no lone surrogate (U+D800-U+DFFF), which JSON's "\ud800"
  escape can spell but UTF-8 (and so jsonb, and a protobuf string) cannot hold;
- at most MAX_DEPTH nested objects/arrays (the top-level object is depth 1): protobuf
  decoders (C++, Java, Python) stop at 100 nested messages, a Struct level costs three and
  the deepest answer (ClaimRuns -> ClaimedRun -> Run -> input) wraps it in three more;
- at most max_bytes as compact UTF-8 JSON AND at most max_bytes encoded as a Struct (the
  encoding can be larger than the JSON: a number costs 9 bytes plus framing), so a run whose
  input and output are both at the limit still fits one answer (settings.deliverable).

Struct numbers are doubles: integral ones come back as ints ({"replicas": 3}, not 3.0) when
they are exactly representable (|n| < 2**53); larger ones stay floats, so nothing accepted
turns into a 300-digit integer."""

from __future__ import annotations

import json
import math
import re
from json.encoder import encode_basestring
from typing import Any

from google.protobuf import struct_pb2

MAX_DEPTH = 32
SAFE_INTEGER = 2**53
ENCODED_PER_JSON_BYTE = 8  # an upper bound of (encoded Struct bytes) / (compact JSON bytes), with margin

# json.dumps writes NUL as \u0000 (an escaped backslash before it does not count)
_JSON_NUL = re.compile(r"(?:^|[^\\])(?:\\\\)*\\u0000")


class JsonValueError(ValueError):
    """A value outside the rules; str() is the description for a BadRequest violation."""


def _number(n: float) -> int | float:
    if n.is_integer() and -SAFE_INTEGER < n < SAFE_INTEGER:
        return int(n)  # 42, not 42.0: ids stay ids
    return n  # NaN / Infinity pass through and are refused when the JSON is written


def _value(v: struct_pb2.Value, depth: int) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "string_value":
        return v.string_value
    if kind == "number_value":
        return _number(v.number_value)
    if kind == "struct_value":
        return _fields(v.struct_value, depth + 1)
    if kind == "list_value":
        if depth + 1 > MAX_DEPTH:
            raise JsonValueError(f"nested deeper than {MAX_DEPTH} levels of objects and arrays")
        return [_value(x, depth + 1) for x in v.list_value.values]
    if kind == "bool_value":
        return v.bool_value
    return None  # null_value, or a Value with no kind set (JSON null)


def _fields(s: struct_pb2.Struct, depth: int) -> dict[str, Any]:
    if depth > MAX_DEPTH:
        raise JsonValueError(f"nested deeper than {MAX_DEPTH} levels of objects and arrays")
    return {k: _value(x, depth) for k, x in s.fields.items()}


def struct_dict(s: struct_pb2.Struct) -> dict[str, Any]:
    """A Struct as plain Python (about twice as fast as json_format.MessageToDict); raises
    JsonValueError when it is nested too deep. Finite numbers and NUL are checked by to_json."""
    return _fields(s, 1)


def to_json(data: Any) -> str:
    """Compact JSON of plain data; raises JsonValueError for NaN / Infinity or NUL."""
    try:
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise JsonValueError("numbers must be finite (no NaN or Infinity)") from None
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise JsonValueError("must not contain NUL characters (U+0000)")
    return text


def utf8_size(text: str) -> int:
    """Bytes of text as UTF-8; raises JsonValueError when it holds a lone surrogate."""
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        raise JsonValueError(
            "keys and strings must be Unicode text: no lone surrogates (a \\ud800-\\udfff escape outside a pair)"
        ) from None


def json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


_NUL = "must not contain NUL characters (U+0000)"
_DEEP = f"nested deeper than {MAX_DEPTH} levels of objects and arrays"
_float_repr = float.__repr__


def _struct_into(s: struct_pb2.Struct, depth: int, out: list[str]) -> None:
    if depth > MAX_DEPTH:
        raise JsonValueError(_DEEP)
    out.append("{")
    sep = ""
    for k, v in s.fields.items():
        if "\x00" in k:
            raise JsonValueError(_NUL)
        out.append(sep + encode_basestring(k) + ":")
        sep = ","
        _value_into(v, depth, out)
    out.append("}")


def _value_into(v: struct_pb2.Value, depth: int, out: list[str]) -> None:
    kind = v.WhichOneof("kind")
    if kind == "string_value":
        text = v.string_value
        if "\x00" in text:
            raise JsonValueError(_NUL)
        out.append(encode_basestring(text))
    elif kind == "number_value":
        n = v.number_value
        if n.is_integer() and -SAFE_INTEGER < n < SAFE_INTEGER:
            out.append(str(int(n)))  # 42, not 42.0: ids stay ids
        elif math.isfinite(n):
            out.append(_float_repr(n))
        else:
            raise JsonValueError("numbers must be finite (no NaN or Infinity)")
    elif kind == "struct_value":
        _struct_into(v.struct_value, depth + 1, out)
    elif kind == "list_value":
        if depth + 1 > MAX_DEPTH:
            raise JsonValueError(_DEEP)
        out.append("[")
        sep = ""
        for x in v.list_value.values:
            out.append(sep)
            sep = ","
            _value_into(x, depth + 1, out)
        out.append("]")
    elif kind == "bool_value":
        out.append("true" if v.bool_value else "false")
    else:
        out.append("null")  # null_value, or a Value with no kind set (JSON null)


def struct_json(s: struct_pb2.Struct, max_bytes: int) -> str:
    """The compact JSON of a Struct a caller sent, written in one pass over the message (no
    intermediate dict, no second encoding pass): the same text as to_json(struct_dict(s)), under
    the same rules; raises JsonValueError naming the rule it breaks."""
    out: list[str] = []
    _struct_into(s, 1, out)
    text = "".join(out)
    size = utf8_size(text)
    if size > max_bytes:
        raise JsonValueError(f"at most {max_bytes} bytes as JSON (got {size})")
    # the encoding costs at most ~5.5x the JSON (a one-digit number in an array: 2 bytes as JSON,
    # 11 encoded); below that bound it cannot exceed the limit and is not measured
    if size * ENCODED_PER_JSON_BYTE > max_bytes:
        encoded = s.ByteSize()
        if encoded > max_bytes:
            raise JsonValueError(f"at most {max_bytes} bytes encoded as a protobuf Struct (got {encoded})")
    return text


def check_struct(s: struct_pb2.Struct, max_bytes: int) -> tuple[dict[str, Any], str]:
    """(plain data, its compact JSON) of a Struct a caller sent; raises JsonValueError naming
    the rule it breaks. The data is the JSON read back (C speed; the same values struct_dict
    gives)."""
    text = struct_json(s, max_bytes)
    return json.loads(text), text


def check_plain(data: Any, max_bytes: int) -> str:
    """The compact JSON of a value built by the server from caller input (e.g. one event of a
    LINE delivery), under the same rules; raises JsonValueError."""
    depth = _depth(data, 0)
    if depth > MAX_DEPTH:
        raise JsonValueError(f"nested deeper than {MAX_DEPTH} levels of objects and arrays")
    text = to_json(data)
    size = utf8_size(text)
    if size > max_bytes:
        raise JsonValueError(f"at most {max_bytes} bytes as JSON (got {size})")
    return text


def _depth(value: Any, level: int) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def is_finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
