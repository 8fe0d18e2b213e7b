"""One figure of the benchmark (value, baseline from the same run, target, verdict) and the
three outputs written from them: results.json, results.md and throughput.png."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

# how a figure is judged against its target
#   ratio_ge: value / baseline >= threshold      ratio_le: value / baseline <= threshold
#   le_baseline_plus: value <= baseline + threshold  le: value <= threshold   report: no target
Rule = Literal["ratio_ge", "ratio_le", "le_baseline_plus", "le", "report"]


@dataclass
class Figure:
    key: str
    title: str
    unit: str
    rule: Rule
    threshold: float | None
    target: str  # as the issue writes it, e.g. "≥ 0.6 ×"
    baseline_label: str = ""
    value: float | None = None
    baseline: float | None = None
    baseline_unit: str = ""
    status: str = "not run"  # measured | not implemented | error | not run
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.baseline:
            return None
        return self.value / self.baseline

    @property
    def passed(self) -> bool | None:
        if self.status != "measured" or self.value is None:
            return None
        t = self.threshold
        if self.rule == "report" or t is None:
            return None
        if self.rule == "le":
            return self.value <= t
        if self.baseline is None:
            return None
        if self.rule == "le_baseline_plus":
            return self.value <= self.baseline + t
        r = self.ratio
        if r is None:
            return None
        return r >= t if self.rule == "ratio_ge" else r <= t

    def measured(self, value: float, baseline: float | None = None, **details: Any) -> Figure:
        self.value, self.baseline, self.status = value, baseline, "measured"
        self.details.update(details)
        return self

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratio"] = None if self.ratio is None else round(self.ratio, 4)
        d["passed"] = self.passed
        return d


def _fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "—"
    if abs(v) >= 1000:
        s = f"{v:,.0f}"
    elif abs(v) >= 100:
        s = f"{v:.0f}"
    elif abs(v) >= 10:
        s = f"{v:.1f}"
    else:
        s = f"{v:.3g}"
    return f"{s} {unit}".strip()


def verdict(f: Figure) -> str:
    if f.status != "measured":
        return f.status
    p = f.passed
    v = "reported" if p is None else ("holds" if p else "MISSED")
    return f"{v}, noisy" if f.details.get("noisy") else v


def _cpu_windows(value: Any) -> list[dict[str, Any]]:
    """Every CPU window (bench/cpu.py cores: an `outside` share beside the `machine`'s) inside a
    figure's details; not the per-unit CPU some figures add (`cpu_us_per_event`: microseconds,
    no `machine`)."""
    if isinstance(value, dict):
        found = [value] if "outside" in value and "machine" in value else []
        return found + [w for v in value.values() for w in _cpu_windows(v)]
    if isinstance(value, list):
        return [w for v in value for w in _cpu_windows(v)]
    return []


def mark_noisy(f: Figure) -> None:
    """Marks a figure noisy when any window it was measured in had other work on the machine
    (bench/cpu.py NOISY_OUTSIDE): its ratio does not compare with another run's."""
    from bench import cpu

    worst = max((w["outside"] for w in _cpu_windows(f.details)), default=0.0)
    reason = cpu.noisy({"outside": worst})
    if reason:
        f.details["noisy"] = reason


def markdown(figures: list[Figure], meta: dict[str, Any]) -> str:
    m = meta["machine"]
    pg = m["postgres"]
    lines = [
        "# awooop benchmark results",
        "",
        f"Run {meta['started_at']} ({meta['mode']} mode, {meta['elapsed_s']:.0f} s), commit `{m['git_commit']}`.",
        f"Machine: {m['cores']} cores ({m['cpu_model']}), {m['memory_mb']} MB RAM, Python {m['python']}, "
        f"grpcio {m['packages']['grpcio']}; load average at start {m['load_average_at_start']}.",
        f"PostgreSQL {pg['version']} ({pg['source']}): "
        + ", ".join(f"{k}={v}" for k, v in pg["settings"].items())
        + f"; one commit takes {pg.get('commit_latency', {}).get('synchronous_commit_on_ms', '?')} ms "
        f"({pg.get('commit_latency', {}).get('synchronous_commit_off_ms', '?')} ms without waiting for the WAL flush)"
        + f". Redis {m['redis']['version']} ({m['redis']['source']}).",
        "",
        "| figure | value | baseline (same run) | ratio | target | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for f in figures:
        base = f"{_fmt(f.baseline, f.baseline_unit or f.unit)} — {f.baseline_label}" if f.baseline_label else "—"
        if f.baseline_label and f.baseline is None:
            base = f"— ({f.baseline_label})"
        ratio = "—" if f.ratio is None or f.rule in ("le", "le_baseline_plus", "report") else f"{f.ratio:.2f} ×"
        lines.append(f"| {f.title} | {_fmt(f.value, f.unit)} | {base} | {ratio} | {f.target} | {verdict(f)} |")
    notes = [f for f in figures if f.note or f.details.get("noisy") or (f.passed is False and f.details.get("bound"))]
    if notes:
        lines += ["", "Notes:", ""]
        for f in notes:
            bound = f.details.get("bound", "") if f.passed is False else ""
            text = "; ".join(x for x in (f.note, f.details.get("noisy", ""), bound) if x)
            lines.append(f"- **{f.title}**: {text}")
    if meta.get("notes"):
        lines += ["", *[f"- {n}" for n in meta["notes"]]]
    lines += ["", "Raw numbers, settings and per-run details: `results.json`. Plot: `throughput.png`.", ""]
    return "\n".join(lines)


def plot(sweep: dict[str, list[dict[str, Any]]], path: Path, title: str) -> bool:
    """Throughput against concurrency, one line per call kind. False when nothing to plot."""
    series = {k: v for k, v in sweep.items() if v}
    if not series:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for label, points in series.items():
        xs = [p["concurrency"] for p in points]
        ys = [p["units_per_s"] for p in points]
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({p["concurrency"] for pts in series.values() for p in pts}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("concurrent calls in flight")
    ax.set_ylabel("calls/s (events/s)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write(out_dir: Path, figures: list[Figure], meta: dict[str, Any], sweep: dict[str, list[dict[str, Any]]]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {**meta, "figures": [f.as_dict() for f in figures], "sweep": sweep}
    (out_dir / "results.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    (out_dir / "results.md").write_text(markdown(figures, meta))
    m = meta["machine"]
    plot(
        sweep,
        out_dir / "throughput.png",
        f"awooop ingest vs gRPC transport ceiling — {m['cores']} cores, "
        f"PostgreSQL {m['postgres']['version'].split()[0]}, {meta['started_at'][:10]}",
    )
