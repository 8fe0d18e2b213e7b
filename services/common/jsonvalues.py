"""JSON values that arrive as google.protobuf.Struct: back to plain Python, checked for what
Postgres JSONB refuses, and measured the way size limits are stated (compact UTF-8 JSON)."""

from __future__ import annotations

import json
import math
from typing import Any

from google.protobuf import json_format, struct_pb2


def plain(value: Any) -> Any:
    """Integral floats back to ints: Struct numbers are doubles, so {"replicas": 3} arrives as
    3.0; callers (and the seed's journal format) expect 3."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def struct_dict(value: struct_pb2.Struct) -> dict[str, Any]:
    return plain(json_format.MessageToDict(value))  # type: ignore[no-any-return]


def has_nul(value: Any) -> bool:
    """Postgres JSONB cannot store U+0000 in keys or strings."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_nul(v) for v in value)
    return False


def json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
