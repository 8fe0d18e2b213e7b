"""Structured JSON logs and Prometheus metrics shared by every service."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from prometheus_client import Counter, Histogram, start_http_server

RPC_REQUESTS = Counter("awooop_rpc_requests_total", "RPCs handled", ["method", "code"])
# reasons: missing (no authorization metadata), malformed (not 'Bearer awk_<id>_<secret>'),
# unknown_key (no live key with that id), wrong_secret (the id exists, the secret does not match)
AUTH_FAILURE_REASONS = ("missing", "malformed", "unknown_key", "wrong_secret")
AUTH_FAILURES = Counter("awooop_auth_failures_total", "Requests refused UNAUTHENTICATED, by reason", ["reason"])
for _reason in AUTH_FAILURE_REASONS:
    AUTH_FAILURES.labels(_reason)  # every series exists at 0 from the start
RPC_LATENCY = Histogram(
    "awooop_rpc_duration_seconds",
    "RPC latency",
    ["method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
LOOP_RUNS = Counter("awooop_background_runs_total", "Background loop passes", ["loop", "outcome"])

_STD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in record.__dict__.items():
            if k not in _STD_ATTRS and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str = "INFO") -> None:
    root = logging.getLogger()
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        root.setLevel(level.upper())
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


_metrics_started: set[int] = set()


def metrics_serving(port: int) -> bool:
    """This process already serves /metrics on port (start_metrics runs once per port)."""
    return port in _metrics_started


def start_metrics(host: str, port: int) -> None:
    """Serves /metrics on port (once per process; 0 disables)."""
    if port and port not in _metrics_started:
        start_http_server(port, addr=host)
        _metrics_started.add(port)
