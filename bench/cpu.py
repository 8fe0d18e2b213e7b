"""Where the CPU went during a measured window: the service process, Postgres (all its
processes), Redis, and the whole machine. Reported in cores (1.0 = one core busy), so a
result says what limited it: a server at ~1.0 is bound by its one event loop; a machine at
~cores is saturated; neither means waiting (fsync, locks, round trips)."""

from __future__ import annotations

from typing import Any

import psutil


def _proc_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def snapshot(server_pid: int | None = None) -> dict[str, float]:
    out = {"postgres": 0.0, "redis": 0.0}
    for p in psutil.process_iter(["name"]):
        name = p.info.get("name") or ""
        group = "postgres" if name.startswith("postgres") else "redis" if name.startswith("redis-server") else None
        if group is None:
            continue
        try:
            out[group] += _proc_seconds(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    if server_pid is not None:
        try:
            out["server"] = _proc_seconds(psutil.Process(server_pid))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    t = psutil.cpu_times()
    out["machine"] = float(t.user + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + t.nice)
    return out


def cores(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, Any]:
    """CPU cores used per group between two snapshots. Postgres backends that ended in
    between lose their time, so postgres is a lower bound when connections churn."""
    return {k: round((after[k] - before[k]) / seconds, 2) for k in after if k in before and seconds > 0}
