"""Input checks that collect every bad field into one INVALID_ARGUMENT.

Usage:
    v = Violations()
    project = v.project_id("project_id", req.project_id)
    run_id = v.uuid("run_id", req.run_id)
    v.raise_if_any()
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from google.protobuf import struct_pb2
from google.protobuf.duration_pb2 import Duration

from services.common import errors, jsonvalues

PROJECT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# ids chosen by callers (worker ids, step ids, tool ids): printable, no whitespace
TOKEN_RE = re.compile(r"^[\x21-\x7e]+$")

# text limits of the boundary: services/common/limits.py


def is_text(value: str) -> bool:
    """Whether value is Unicode text the store can hold: no lone surrogate. Over HTTP, aiohttp
    hands a header or cookie's invalid UTF-8 bytes over as lone surrogates (surrogateescape)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


class Violations:
    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, field: str, description: str) -> None:
        self.items.append((field, description))

    def check(self, ok: bool, field: str, description: str) -> bool:
        if not ok:
            self.add(field, description)
        return ok

    def raise_if_any(self) -> None:
        if self.items:
            raise errors.invalid(self.items)

    # --- typed checks; each returns the cleaned value (or a harmless default) ---

    def project_id(self, field: str, value: str) -> str:
        if not value:
            self.add(field, "required")
        elif not PROJECT_RE.match(value):
            self.add(field, "1-64 chars of letters, digits, '.', '_', '-', starting with a letter or digit")
        return value

    def uuid(self, field: str, value: str) -> str:
        if not value:
            self.add(field, "required")
            return ""
        try:
            return str(uuid.UUID(value))
        except (ValueError, AttributeError):
            self.add(field, "must be a UUID")
            return ""

    def text(self, field: str, value: str, *, max_len: int, required: bool = False) -> str:
        if required and not value:
            self.add(field, "required")
        elif len(value) > max_len:
            self.add(field, f"at most {max_len} characters")
        elif "\x00" in value:
            self.add(field, "must not contain NUL characters")
        elif not is_text(value):
            self.add(field, "must be valid UTF-8")
        return value

    def token(self, field: str, value: str, *, max_len: int, required: bool = True) -> str:
        if not value:
            if required:
                self.add(field, "required")
        elif len(value) > max_len:
            self.add(field, f"at most {max_len} characters")
        elif not TOKEN_RE.match(value):
            self.add(field, "printable ASCII without spaces")
        return value

    def int_range(self, field: str, value: int, lo: int, hi: int, *, default: int | None = None) -> int:
        if value == 0 and default is not None:
            return default
        if not lo <= value <= hi:
            self.add(field, f"must be between {lo} and {hi}")
        return value

    def enum(self, field: str, value: int, enum_type: Any) -> int:
        names = enum_type.keys() if hasattr(enum_type, "keys") else []
        if value == 0:
            self.add(field, "required (must not be *_UNSPECIFIED)")
        elif value not in enum_type.values():
            self.add(field, f"unknown value {value}; one of {', '.join(names[1:])}")
        return value

    def duration(self, field: str, value: Duration, *, max_seconds: float, default: float) -> float:
        secs = value.seconds + value.nanos / 1e9
        if secs == 0:
            return default
        if secs < 0 or secs > max_seconds:
            self.add(field, f"must be between 0 and {max_seconds:g} seconds")
            return default
        return secs

    def json(self, field: str, value: struct_pb2.Struct, *, max_bytes: int) -> tuple[dict[str, Any], str]:
        """A Struct under the JSON value rules (jsonvalues): (plain data, compact JSON text);
        a broken rule is a violation of field and the value is ({}, "{}")."""
        try:
            return jsonvalues.check_struct(value, max_bytes)
        except jsonvalues.JsonValueError as exc:
            self.add(field, str(exc))
            return {}, "{}"

    def json_text(self, field: str, value: struct_pb2.Struct, *, max_bytes: int) -> str:
        """A Struct under the JSON value rules as compact JSON text only (no plain data built);
        a broken rule is a violation of field and the value is "{}"."""
        try:
            return jsonvalues.struct_json(value, max_bytes)
        except jsonvalues.JsonValueError as exc:
            self.add(field, str(exc))
            return "{}"

    def struct(self, field: str, value: struct_pb2.Struct, *, max_bytes: int) -> dict[str, Any]:
        """A Struct as plain data under the JSON value rules."""
        return self.json(field, value, max_bytes=max_bytes)[0]


def to_struct(data: dict[str, Any] | None) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    if data:
        s.update(data)
    return s
