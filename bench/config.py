"""Sizes of one benchmark run. The full run fits in ~10 minutes on 2 cores, --quick in ~2."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Config:
    quick: bool = False
    # load generator: client processes, measured window and warm-up per load point
    processes: int = 2
    duration: float = 5.0
    warmup: float = 1.0
    # concurrency sweep (plot) and the point the table reads
    concurrencies: list[int] = field(default_factory=lambda: [1, 4, 16, 64])
    table_concurrency: int = 64
    table_rounds: int = 3  # interleaved rounds at table_concurrency; the table takes the median
    # ids ingested first, then sent again as duplicates (the Redis fast path)
    duplicate_ids: int = 2000
    # batch ingest vs raw SQL
    batch_size: int = 500
    batch_concurrency: int = 4
    batch_duration: float = 6.0  # a batch call takes ~100 ms: a longer window than single calls
    # claim cycles vs PgQueuer
    claim_jobs: int = 20000
    claim_workers: int = 16
    claim_batch: int = 10  # PgQueuer's default batch size; awooop claims the same number
    # store cost per run (bench/store_cost.py): runs through the whole cycle, jobs through PgQueuer
    store_cost_runs: int = 10000
    # journal
    journal_steps: int = 1000  # DBOS steps and awooop steps at the long journal
    journal_short: int = 10
    journal_window: int = 100  # journal write pairs timed at each length (awooop)
    dbos_steps: int = 1000  # steps of the DBOS workflow (per-step cost does not depend on it)
    # reaper
    reaper_finished_big: int = 1_000_000
    reaper_finished_small: int = 10_000
    reaper_expired: int = 1000  # RUNNING runs with expired leases present in each cost run
    reaper_repeats: int = 5
    reap_pass: int = 10_000  # expired leases reaped in one pass
    # queue depth (bench/depth.py): executions of each statement at each size (the finished
    # runs retained are reaper_finished_small, then reaper_finished_big)
    depth_repeats: int = 41
    # durable waits
    waits_parked: int = 10_000  # parked runs (each with its open wait) in the table
    waits_claimable: int = 20_000  # PENDING runs the claim takes its batches from
    waits_repeats: int = 41
    waits_window: float = 60.0  # seconds the store's writes are counted with parked runs only
    waits_resume_samples: int = 200  # completion -> handler resumed
    # run event streams
    run_events_samples: int = 200  # progress events emitted (one after another) to a watcher
    # token streams (bench/token_streams.py): runs streaming at once, tokens/s each, seconds measured
    token_streams_runs: int = 100
    token_streams_rate: int = 1000
    token_streams_seconds: float = 10.0
    # crash
    crash_lease_ttl: float = 2.0
    crash_reaper_interval: float = 0.5
    crash_trials: int = 3
    # service settings under test (beyond the defaults): --uvloop, --set NAME=VALUE
    service_uvloop: bool = False
    service_settings: dict[str, str] = field(default_factory=dict)

    @classmethod
    def quick_mode(cls) -> Config:
        return cls(
            quick=True,
            warmup=0.5,
            concurrencies=[1, 16, 64],
            table_rounds=3,
            duration=1.0,
            duplicate_ids=500,
            batch_duration=3.0,
            claim_jobs=3000,
            store_cost_runs=2000,
            journal_steps=1000,
            journal_window=50,
            dbos_steps=300,
            reaper_finished_big=200_000,
            reaper_repeats=3,
            reap_pass=10_000,
            depth_repeats=21,
            crash_trials=1,
            waits_window=15.0,
            waits_resume_samples=40,
            run_events_samples=50,
            token_streams_seconds=4.0,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
