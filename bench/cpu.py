"""Where the CPU went during a measured window: the service process, Postgres (all its
processes on this machine), Redis, and the whole machine. Reported in cores (1.0 = one core
busy), so a result says what limited it: a server at ~1.0 is bound by its one event loop; a
machine at ~cores is saturated; neither means waiting (fsync, locks, round trips)."""

from __future__ import annotations

from typing import Any

import psutil

Snapshot = dict[str, Any]


def _group(name: str) -> str | None:
    if name.startswith("postgres"):
        return "postgres"
    if name.startswith("redis-server"):
        return "redis"
    return None


def snapshot(server_pid: int | None = None) -> Snapshot:
    procs: dict[int, tuple[str, float]] = {}
    for p in psutil.process_iter(["name"]):
        group = "server" if p.pid == server_pid else _group(p.info.get("name") or "")
        if group is None:
            continue
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        procs[p.pid] = (group, float(t.user + t.system))
    t = psutil.cpu_times()
    machine = float(t.user + t.system + t.nice + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0))
    return {"procs": procs, "machine": machine}


def cores(before: Snapshot, after: Snapshot, seconds: float) -> dict[str, float]:
    """CPU cores used per group between two snapshots. A process that started in between
    counts whole; one that ended in between is lost (so postgres is a lower bound when
    connections churn)."""
    if seconds <= 0:
        return {}
    used: dict[str, float] = {"postgres": 0.0, "redis": 0.0}
    for pid, (group, secs) in after["procs"].items():
        prev = before["procs"].get(pid)
        used[group] = used.get(group, 0.0) + secs - (prev[1] if prev and prev[0] == group else 0.0)
    used["machine"] = after["machine"] - before["machine"]
    return {k: round(max(0.0, v) / seconds, 2) for k, v in used.items()}


def bound(used: dict[str, float], cores_total: int) -> str:
    """A one-line reading of a window's CPU: what the work most likely waited on."""
    server, machine, pg = used.get("server"), used.get("machine", 0.0), used.get("postgres", 0.0)
    if server is not None and server >= 0.85:
        return f"service process CPU-bound ({server:.2f} cores: one Python event loop)"
    if machine >= 0.9 * cores_total:
        return f"machine CPU saturated ({machine:.2f} of {cores_total} cores; service {server}, Postgres {pg:.2f})"
    if pg >= 0.85:
        return f"Postgres CPU-bound ({pg:.2f} cores)"
    return f"latency-bound (service {server}, Postgres {pg:.2f}, machine {machine:.2f} cores): commits, round trips"
