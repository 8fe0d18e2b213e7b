"""Structured JSON logs and Prometheus metrics shared by every service.

Metric rules (docs/operations.md lists every metric and the alert that uses it):
- no `_created` series (disable_created_metrics below: they double the series count and no
  rule uses them);
- a labelled metric has each of its known label values present at 0 from start-up
  (`preset`), so `increase(x[10m]) > 0` fires on the first increment;
- gRPC server metrics use the standard names and labels of go-grpc-prometheus /
  py-grpc-prometheus (grpc_server_started_total, grpc_server_handled_total,
  grpc_server_handling_seconds), so stock gRPC dashboards and alerts work unchanged.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any, Protocol

import grpc
from google.protobuf import descriptor_pool
from prometheus_client import Counter, Histogram, disable_created_metrics, start_http_server

from services.common import tracing

disable_created_metrics()  # type: ignore[no-untyped-call]

# grpc_type of every awooop RPC (all unary); health Watch and reflection are not counted
UNARY = "unary"

# go-grpc-prometheus' grpc_code values: codes.Code.String() (CamelCase), e.g. "InvalidArgument"
GRPC_CODE_NAMES: dict[grpc.StatusCode, str] = {
    c: "OK" if c is grpc.StatusCode.OK else "".join(w.capitalize() for w in c.name.split("_")) for c in grpc.StatusCode
}

GRPC_STARTED = Counter(
    "grpc_server_started_total",
    "Total number of RPCs started on the server.",
    ["grpc_type", "grpc_service", "grpc_method"],
)
GRPC_HANDLED = Counter(
    "grpc_server_handled_total",
    "Total number of RPCs completed on the server, regardless of success or failure.",
    ["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
)
GRPC_HANDLING = Histogram(
    "grpc_server_handling_seconds",
    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
    ["grpc_type", "grpc_service", "grpc_method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
LOOP_RUNS = Counter("awooop_background_runs_total", "Background loop passes", ["loop", "outcome"])


class _Labelled(Protocol):
    def labels(self, *values: str) -> Any: ...


def preset(metric: _Labelled, *label_sets: Iterable[str]) -> None:
    """Creates the children of every combination of the given label values (the cartesian
    product, in label order), so each series is exported at 0 before its first increment."""
    combos: list[tuple[str, ...]] = [()]
    for values in label_sets:
        combos = [(*c, v) for c in combos for v in values]
    for c in combos:
        metric.labels(*c)


def split_method(full: str) -> tuple[str, str]:
    """'/pkg.Service/Method' -> ('pkg.Service', 'Method')."""
    service, _, method = full.lstrip("/").partition("/")
    return service, method


class RpcMetrics:
    """The standard gRPC server metrics of one method, children bound once (the hot path
    only increments)."""

    def __init__(self, full_method: str) -> None:
        service, method = split_method(full_method)
        self.started = GRPC_STARTED.labels(UNARY, service, method)
        self.handling = GRPC_HANDLING.labels(UNARY, service, method)
        # by the status' Python name ("INVALID_ARGUMENT"), as the interceptor knows it
        self._handled = {c.name: GRPC_HANDLED.labels(UNARY, service, method, go) for c, go in GRPC_CODE_NAMES.items()}
        self._unknown = self._handled["UNKNOWN"]

    def handled(self, code: str, seconds: float) -> None:
        """One answer with status `code` (a grpc.StatusCode name) after `seconds`."""
        self._handled.get(code, self._unknown).inc()
        self.handling.observe(seconds)


# reasons: missing (no authorization metadata), malformed (not 'Bearer awk_<id>_<secret>'),
# unknown_key (no live key with that id), wrong_secret (the id exists, the secret does not match)
AUTH_FAILURE_REASONS = ("missing", "malformed", "unknown_key", "wrong_secret")
AUTH_FAILURES = Counter("awooop_auth_failures_total", "Requests refused UNAUTHENTICATED, by reason", ["reason"])
preset(AUTH_FAILURES, AUTH_FAILURE_REASONS)


def preset_grpc_metrics(service_names: Iterable[str]) -> None:
    """Exports every method of these services (from the generated descriptors) at 0 for every
    code, as go-grpc-prometheus' InitializeMetrics does."""
    pool = descriptor_pool.Default()
    for name in service_names:
        for m in pool.FindServiceByName(name).methods:
            RpcMetrics(f"/{name}/{m.name}")


# the run an RPC or a background task is about: every log line written meanwhile carries it
RUN_ID: ContextVar[str] = ContextVar("awooop_run_id", default="")


def run_id_getter(full_method: str) -> Callable[[Any], str] | None:
    """How to read the run a method's request names (its run_id, or its lease's), decided once
    per method from the generated descriptors; None when the request names no run."""
    service, method = split_method(full_method)
    try:
        fields = descriptor_pool.Default().FindServiceByName(service).methods_by_name[method].input_type.fields_by_name
    except KeyError:
        return None
    if "run_id" in fields and fields["run_id"].type == fields["run_id"].TYPE_STRING:
        return lambda request: str(request.run_id)
    if "lease" in fields:
        return lambda request: str(request.lease.run_id)
    return None


_STD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        run_id = RUN_ID.get()
        if run_id:
            out["run_id"] = run_id
        out.update(tracing.log_fields())  # trace_id, span_id while tracing is on
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


_metrics_started: dict[int, int] = {}


def metrics_serving(port: int) -> bool:
    """This process already serves /metrics on port (start_metrics runs once per port)."""
    return port in _metrics_started


def start_metrics(host: str, port: int) -> int:
    """Serves /metrics on port (once per process; 0 disables). Returns the bound port (0: off)."""
    if not port:
        return 0
    if port not in _metrics_started:
        server, _ = start_http_server(port, addr=host)
        _metrics_started[port] = server.server_port
    return _metrics_started[port]
