"""The console's Prometheus metrics (docs/operations.md lists them)."""

from __future__ import annotations

from prometheus_client import Counter

SIGNIN_FAILURES = Counter(
    "awooop_console_signin_failures_total", "Console sign-ins refused because the key was not accepted"
)
SIGNIN_THROTTLED = Counter(
    "awooop_console_signin_throttled_total",
    "Console sign-ins refused (429) without checking the key: too many failures from the client address or "
    "with the key id",
    ["by"],
)
for _by in ("address", "key_id"):
    SIGNIN_THROTTLED.labels(_by)
