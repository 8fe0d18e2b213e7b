"""Debounce rules' key expressions, defined once: the scheduler validates them (SetDebounceRule)
and ingest evaluates them on each event of a debounced channel (docs/flow-control.md#debounce-and-batch).

An expression is a dotted path into the event's input (the JSON its run would get: the delivery's
payload, LINE's event object, an IngestEvent's explicit `input`): 1 to 8 segments separated by
`.`, each 1-64 letters, digits, `_` or `-`. A segment names an object's member, or, when it is all
digits, a list's element (`alerts.0.labels.alertname`). Examples: `message.chat.id` (Telegram),
`groupKey` (Alertmanager), `source.userId` (LINE), `repository.full_name` (Gitea), `order.customer`
(the API channel).

An event's key is the value at the path: a string as it is, a number or boolean as its JSON text.
No value there (a missing member, null, an object or a list) means the event has no key: it is
not debounced and becomes a run of its own, as without a rule. A key longer than MAX_KEY
characters is replaced by "sha256:<hex of it>", as Alertmanager's long group keys are in
provider event ids.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

MAX_EXPRESSION = 256
MAX_SEGMENTS = 8
MAX_KEY = 256
_SEGMENT = re.compile(r"[A-Za-z0-9_-]{1,64}")
SYNTAX = "a dotted path of 1-8 segments of letters, digits, '_' or '-' (e.g. message.chat.id)"


def parse(expression: str) -> tuple[str, ...] | None:
    """The path's segments, or None when the expression is not one (see SYNTAX)."""
    if not expression or len(expression) > MAX_EXPRESSION:
        return None
    parts = tuple(expression.split("."))
    if len(parts) > MAX_SEGMENTS or not all(_SEGMENT.fullmatch(p) for p in parts):
        return None
    return parts


def evaluate(path: tuple[str, ...], data: Any) -> str | None:
    """The key at path in data (an event's input, parsed), or None when there is none."""
    value = data
    for part in path:
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool | int | float):
        text = json.dumps(value)
    else:
        return None
    if len(text) > MAX_KEY or "\x00" in text:
        return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return text
