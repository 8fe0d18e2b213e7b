"""Where the CPU went during a measured window: the service process, Postgres (all its
processes on this machine), Redis, and the whole machine. Reported in cores (1.0 = one core
busy), so a result says what limited it: a server at ~1.0 is bound by its one event loop; a
machine at ~cores is saturated; neither means waiting (fsync, locks, round trips).

`outside` is the CPU the rest of the machine used in the window, counted on its own processes:
every process that is neither this benchmark's (the bench process, its load processes and
services) nor Postgres or Redis. A
figure whose window had more than NOISY_OUTSIDE cores of it was measured beside other work and is
marked noisy: not comparable to another run, in either direction (docs/benchmarks.md)."""

from __future__ import annotations

import os
from typing import Any

import psutil

Snapshot = dict[str, Any]

# cores used outside the run above which a window is noisy: a tenth of a core is what an idle
# desktop session or a shell's polling costs; a test suite or another benchmark beside the run
# costs a whole core or more
NOISY_OUTSIDE = 0.1


def _group(name: str) -> str | None:
    if name.startswith("postgres"):
        return "postgres"
    if name.startswith("redis-server"):
        return "redis"
    return None


def _ours() -> set[int]:
    """This process and every process below it: the load processes and the services it started."""
    me = psutil.Process(os.getpid())
    try:
        return {me.pid, *(c.pid for c in me.children(recursive=True))}
    except psutil.Error:
        return {me.pid}


def snapshot(server_pid: int | None = None) -> Snapshot:
    procs: dict[int, tuple[str, float]] = {}
    ours = _ours()
    for p in psutil.process_iter(["name"]):
        group = "server" if p.pid == server_pid else _group(p.info.get("name") or "")
        if group is None:
            # the load processes and the other services of this run, or another's work
            group = "bench" if p.pid in ours else "outside"
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        # with the time of its exited children (a postgres backend whose connection closed, a
        # load process that ended): the kernel adds it to the parent once it has reaped them
        procs[p.pid] = (group, float(t.user + t.system + t.children_user + t.children_system))
    t = psutil.cpu_times()
    machine = float(t.user + t.system + t.nice + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0))
    return {"procs": procs, "machine": machine}


def cores(before: Snapshot, after: Snapshot, seconds: float) -> dict[str, float]:
    """CPU cores used per group between two snapshots. A process that started in between
    counts whole. One that ended in between is counted in its parent's children time (the
    postmaster's for a backend, the bench's for a load process) with its whole life, so the part
    it used before the window is taken off its group."""
    if seconds <= 0:
        return {}
    used: dict[str, float] = {"postgres": 0.0, "redis": 0.0}
    for pid, (group, secs) in after["procs"].items():
        prev = before["procs"].get(pid)
        used[group] = used.get(group, 0.0) + secs - (prev[1] if prev and prev[0] == group else 0.0)
    for pid, (group, secs) in before["procs"].items():
        # (not for other work's processes: a short command's parent may be gone too, and a
        # noisy mark is the safe side to err on)
        if pid not in after["procs"] and group != "outside":
            used[group] = used.get(group, 0.0) - secs
    used.setdefault("outside", 0.0)
    used["machine"] = after["machine"] - before["machine"]
    return {k: round(max(0.0, v) / seconds, 2) for k, v in used.items()}


def noisy(used: dict[str, float]) -> str:
    """'' for a quiet window, else why its figure does not compare."""
    outside = used.get("outside", 0.0)
    if outside > NOISY_OUTSIDE:
        return f"noisy: processes outside the run used {outside:.2f} cores in the window (limit {NOISY_OUTSIDE})"
    return ""


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
