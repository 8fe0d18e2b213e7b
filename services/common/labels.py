"""Worker labels (docs/flow-control.md, "Worker labels"): the key=value pairs a worker declares
(ClaimRunsRequest.labels) and a run requires or prefers (required_labels, preferred_labels). One
rule for all of them: what a key and a value may be, how many, and their JSON form in the store
(a JSON object compared with jsonb @>: a worker matches when its labels contain the run's)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from services.common.validate import Violations

# a key like a Kubernetes label's name (an optional prefix/ and a name), a value like its value
KEY_RE = re.compile(r"^([a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
VALUE_RE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")
KEY_RULE = "a label key: up to 63 letters, digits, '-', '_', '.' (alphanumeric at both ends), an optional dns-prefix/"
VALUE_RULE = "a label value: empty, or up to 63 letters, digits, '-', '_', '.' (alphanumeric at both ends)"
MAX_LABELS = 16  # per worker, and per run of each kind


def parse(v: Violations, field: str, labels: Mapping[str, str]) -> dict[str, str]:
    """The labels validated (problems go to v under field), sorted by key."""
    if len(labels) > MAX_LABELS:
        v.add(field, f"at most {MAX_LABELS} labels, got {len(labels)}")
        return {}
    for key, value in labels.items():
        if not KEY_RE.match(key):
            v.add(f"{field}[{key!r}]", KEY_RULE)
        if not VALUE_RE.match(value):
            v.add(f"{field}[{key!r}]", VALUE_RULE)
    return dict(sorted(labels.items()))


def to_json(labels: Mapping[str, str]) -> str | None:
    """The store's form (a JSON object; None: no labels, the column stays NULL)."""
    return json.dumps(dict(sorted(labels.items())), separators=(",", ":")) if labels else None


def from_json(value: object) -> dict[str, str]:
    """A stored labels column (asyncpg hands jsonb over as text) back as a dict ({} for NULL)."""
    if value is None:
        return {}
    loaded: dict[str, object] = json.loads(value) if isinstance(value, str) else dict(value)  # type: ignore[call-overload]
    return {str(k): str(x) for k, x in loaded.items()}
