"""Settings from AWOOOP_* environment variables, with the documented defaults.

Every knob lives here so the README's configuration table has one source. Durations
are seconds (floats allowed) so tests can shorten leases and loops.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any


def _env(name: str, default: Any, cast: type) -> Any:
    raw = os.environ.get(f"AWOOOP_{name}")
    if raw is None or raw == "":
        return default
    if cast is bool:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    return cast(raw)


@dataclass(frozen=True)
class Settings:
    # --- store and cache ---
    database_url: str = ""  # empty: `awooop up` starts an embedded Postgres
    redis_url: str = ""  # empty: `awooop up` starts an embedded Redis; services run without Redis
    redis_prefix: str = "awooop:"  # every Redis key starts with this (lets tenants of one Redis coexist)
    db_pool_min: int = 2
    db_pool_max: int = 10
    db_statement_timeout: float = 10.0
    db_connect_timeout: float = 5.0
    migrate_on_start: bool = False

    # --- listeners ---
    host: str = "127.0.0.1"
    ingest_port: int = 50051
    scheduler_port: int = 50052
    saga_port: int = 50053
    gateway_port: int = 50054
    metrics_port: int = 9464  # 0 disables the Prometheus endpoint
    tls_cert_file: str = ""
    tls_key_file: str = ""
    shutdown_grace: float = 10.0
    max_message_bytes: int = 4 * 1024 * 1024
    log_level: str = "INFO"
    access_log: bool = True  # one JSON line per RPC
    uvloop: bool = False  # run the event loop on uvloop (pip install awooop[uvloop])

    # --- auth ---
    auth_cache_seconds: float = 5.0  # how long a verified API key is trusted before re-reading it
    internal_api_key: str = ""  # key the scheduler presents to the saga service

    # --- ingest ---
    max_payload_bytes: int = 256 * 1024
    max_batch: int = 1000
    dedupe_retention: float = 7 * 24 * 3600.0
    idempotency_ttl: float = 24 * 3600.0
    policy_version: str = "v1"  # sanitizer/policy version recorded with idempotency keys
    prune_interval: float = 300.0
    prune_batch: int = 5000
    redis_dedupe_ttl: float = 24 * 3600.0

    # --- scheduler ---
    lease_ttl: float = 300.0
    heartbeat_interval: float = 30.0
    reaper_interval: float = 60.0
    max_attempts: int = 3
    retry_backoff: float = 5.0
    approval_ttl: float = 900.0
    approval_sweep_interval: float = 30.0
    max_claim_wait: float = 60.0

    # --- saga ---
    saga_addr: str = ""  # scheduler -> saga nudges; empty: the saga's recovery loop picks requests up
    gateway_addr: str = "127.0.0.1:50054"
    max_step_result_bytes: int = 64 * 1024
    compensation_interval: float = 5.0
    compensation_lease: float = 60.0
    tool_timeout: float = 30.0
    telegram_api_base: str = "https://api.telegram.org"
    telegram_bot_token: str = ""
    telegram_chat_id: str = ""
    alert_stream: str = "alerts"  # Redis stream (under redis_prefix) that receives escalations

    extra: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "extra":
                continue
            default = f.default
            values[f.name] = _env(f.name.upper(), default, type(default))
        values.update(overrides)
        return cls(**values)

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    def port_of(self, service: str) -> int:
        return int(getattr(self, f"{service}_port"))


def describe() -> list[tuple[str, str]]:
    """(ENV NAME, default) pairs, for docs and `awooop config`."""
    out = []
    for f in fields(Settings):
        if f.name == "extra":
            continue
        out.append((f"AWOOOP_{f.name.upper()}", repr(f.default)))
    return out
