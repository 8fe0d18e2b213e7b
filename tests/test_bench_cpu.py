"""bench/cpu.py's accounting of a window, and the noisy mark it gives a figure: a process that
ended inside the window is counted through its parent's children time without its life before
the window, and what no process of the run used is `outside`. A real child process is measured,
so the test also holds the kernel's side: its CPU reaches the parent once it is reaped."""

from __future__ import annotations

import multiprocessing
import time

from bench import cpu
from bench.report import Figure, mark_noisy, verdict


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_child_that_ends_inside_the_window_is_counted_once() -> None:
    before = cpu.snapshot()
    t0 = time.monotonic()
    child = multiprocessing.get_context("spawn").Process(target=_spin, args=(0.5,))
    child.start()
    child.join()
    used = cpu.cores(before, cpu.snapshot(), time.monotonic() - t0)
    seconds = time.monotonic() - t0
    # the child's 0.5 s of CPU is the bench group's, not another's
    assert used["bench"] * seconds >= 0.45, used
    assert used["bench"] * seconds <= 0.5 + 0.5 * seconds + 0.3, used


def test_a_process_gone_before_the_end_loses_its_earlier_time() -> None:
    before = {
        "procs": {10: ("postgres", 5.0), 11: ("postgres", 2.0), 1: ("postgres", 0.0), 99: ("outside", 7.0)},
        "machine": 100.0,
    }
    # backend 11 ended after using 1 s more: the postmaster (1) now carries its 3 s
    after = {"procs": {10: ("postgres", 5.5), 1: ("postgres", 3.0), 99: ("outside", 7.5)}, "machine": 102.0}
    used = cpu.cores(before, after, 1.0)
    assert used["postgres"] == 1.5  # 0.5 of backend 10, 1.0 of backend 11 in the window
    assert used["outside"] == 0.5


def test_a_figure_measured_beside_other_work_is_marked_noisy() -> None:
    quiet = Figure("a", "a", "runs/s", "ratio_ge", 1.0, "≥ 1 ×").measured(
        2.0,
        1.0,
        cpu_cores={"outside": 0.02, "machine": 1.5},
        # per-unit CPU in microseconds is no window: 13 µs outside per call is not 13 cores
        cpu_us_per_event={"outside": 13.1, "server": 400.0},
    )
    busy = Figure("b", "b", "runs/s", "ratio_ge", 1.0, "≥ 1 ×").measured(
        2.0, 1.0, run={"drain": {"cpu_cores": {"outside": 0.9, "machine": 1.9}}}
    )
    for f in (quiet, busy):
        mark_noisy(f)
    assert verdict(quiet) == "holds"
    assert verdict(busy) == "holds, noisy"
    assert "0.90 cores" in busy.details["noisy"]
