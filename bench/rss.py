"""Peak resident memory of each service process, read from /proc/<pid>/status (VmHWM, the
kernel's high-water mark of resident memory) right after that service carried its load, and
before it is stopped. The figure is the largest peak over all service processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report import Figure

LIMIT_MB = 200.0
_samples: list[dict[str, Any]] = []


def _status_kb(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def record(service: str, svc: Any, when: str) -> dict[str, Any] | None:
    """Samples the process now; the sample keeps the peak since the process started."""
    hwm = _status_kb(svc.pid, "VmHWM")
    cur = _status_kb(svc.pid, "VmRSS")
    if hwm is None:
        return None
    sample = {
        "service": service,
        "pid": svc.pid,
        "when": when,
        "peak_rss_mb": round(hwm / 1024, 1),
        "rss_now_mb": round((cur or 0) / 1024, 1),
    }
    _samples.append(sample)
    return sample


def reset() -> None:
    _samples.clear()


def figure() -> Figure:
    f = Figure(
        "peak_rss",
        "peak RSS of each service under load",
        "MB",
        "le",
        LIMIT_MB,
        f"≤ {LIMIT_MB:.0f} MB",
    )
    if not _samples:
        f.status = "not run"
        return f
    by_service: dict[str, float] = {}
    for s in _samples:
        by_service[s["service"]] = max(by_service.get(s["service"], 0.0), s["peak_rss_mb"])
    f.measured(max(by_service.values()), None, per_service_mb=by_service, samples=list(_samples))
    f.note = "per service: " + ", ".join(f"{k} {v:.0f} MB" for k, v in sorted(by_service.items()))
    return f
