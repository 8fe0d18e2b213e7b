"""The invariant soak's seeded plan (tests/test_invariant_soak.py): the projects and their flow
settings, each submitted run's outcome and keys, and when workers, the scheduler and Postgres
crash. Everything random comes from one `random.Random(seed)`, so a seed names one soak (the
machine's timing still varies: a failure prints the seed to rerun it with AWOOOP_SOAK_SEED)."""

from __future__ import annotations

import datetime as dt
import os
import random
from dataclasses import dataclass, field

SEED_ENV = "AWOOOP_SOAK_SEED"

# seconds of load (events submitted, crashes), then the drain
LOAD_SECONDS = 50.0
RESUME_AT = 28.0  # the paused project is resumed, with time left to drain it
WORKERS = 3

# a handler's outcome -> weight; nonretry only where the project's policy names its code
OUTCOMES = {"ok": 55, "flaky": 15, "doomed": 5, "fatal": 10, "nonretry": 15}


@dataclass(frozen=True)
class Limit:
    key: str
    max_running: int = 0  # 0: none
    max_starts: int = 0  # 0: no rate
    per_seconds: float = 0.0
    share: float = 0.7  # of the project's runs that carry the key


@dataclass(frozen=True)
class Project:
    name: str
    weight: int = 0  # 0: no SetProjectFlow at all (the service's defaults)
    initial_backoff: float = 0.0
    max_backoff: float = 0.0
    max_attempts: int = 0
    non_retryable: tuple[str, ...] = ()
    limits: tuple[Limit, ...] = ()
    paused: bool = False
    # (name, cron) of its schedules: every N seconds ("*/N" in the first of 6 fields, seconds)
    schedules: tuple[tuple[str, str], ...] = ()


NONRETRY_CODE = "E-SOAK-NONRETRY"  # tests/soak_worker.py fails with it
FATAL_CODE = "E-SOAK-FATAL"
HANDLER_CODE = "E-WORKER-HANDLER"  # the SDK's code for a handler that raised
MAX_ATTEMPTS_CODE = "E-RUN-MAX-ATTEMPTS"  # the reaper's, for a run whose leases kept expiring

PROJECTS = (
    # one at a time (mutual exclusion): few of its runs carry the key, or on a loaded machine its
    # queue outgrows the soak
    Project(
        "soak-a", weight=1, initial_backoff=0.2, max_backoff=1.0, max_attempts=4, limits=(Limit("db", 1, share=0.3),)
    ),
    Project(
        "soak-b",
        weight=3,
        initial_backoff=0.1,
        max_backoff=0.5,
        max_attempts=5,
        non_retryable=(NONRETRY_CODE,),
        limits=(Limit("llm", 2, max_starts=8, per_seconds=1.0),),
    ),
    Project("soak-c", weight=2, initial_backoff=0.3, max_backoff=1.0, limits=(Limit("k8s", 2), Limit("llm", 3))),
    # paused until RESUME_AT: its backlog then drains through the key (3 at a time, so it drains
    # within the soak: with 1 it took longer than the drain allows)
    Project("soak-d", weight=1, limits=(Limit("db", 3),), paused=True),
    Project("soak-e", schedules=(("tick-e", "*/2 * * * * *"),)),
    Project(
        "soak-f",
        weight=5,
        limits=(Limit("api", max_starts=10, per_seconds=1.0),),
        schedules=(("tick-f", "*/3 * * * * *"),),
    ),
)
PAUSED = next(p.name for p in PROJECTS if p.paused)
# A schedule whose ticks run out: its one tick is a few seconds after it is set (a year field),
# after which there is no next tick. It fires once and rests, and must not stop the others.
BAD_SCHEDULE_PROJECT = "soak-f"
BAD_SCHEDULE_NAME = "once"
# A cron that never fires again: SetSchedule refuses it as bad input.
NEVER_CRON = "0 0 0 1 1 * 2020"


def period_of(cron: str) -> int:
    """N of a schedule "*/N * * * * *"."""
    return int(cron.split()[0].removeprefix("*/"))


def once_cron(at_utc_seconds: float) -> str:
    """Fires at the given second (UTC) and never again (7 fields: seconds first, the year last)."""
    t = dt.datetime.fromtimestamp(at_utc_seconds, dt.UTC)
    return f"{t.second} {t.minute} {t.hour} {t.day} {t.month} * {t.year}"


@dataclass(frozen=True)
class RunPlan:
    event_id: str
    project: str
    outcome: str
    work_ms: int
    keys: tuple[str, ...]
    priority: int


@dataclass
class Crash:
    at: float  # seconds into the load
    what: str  # "worker", "scheduler" or "postgres"
    down_for: float  # seconds before the restart


@dataclass
class RunStream:
    """One producer's events, from its own generator (so the producers' interleaving does not
    change what each sends)."""

    seed: int
    producer: int
    rng: random.Random
    _n: int = 0

    def next_run(self) -> RunPlan:
        """The next event's run: a project (the paused one too), an outcome, keys of its project."""
        self._n += 1
        project = self.rng.choice(PROJECTS)
        outcomes = [o for o in OUTCOMES if o != "nonretry" or NONRETRY_CODE in project.non_retryable]
        outcome = self.rng.choices(outcomes, weights=[OUTCOMES[o] for o in outcomes])[0]
        keys = tuple(limit.key for limit in project.limits if self.rng.random() < limit.share)
        return RunPlan(
            event_id=f"soak-{self.seed}-{self.producer}-{self._n}",
            project=project.name,
            outcome=outcome,
            work_ms=self.rng.randint(50, 600),
            keys=keys,
            priority=self.rng.choice([0, 0, 0, 5, -5]),
        )

    def batch_size(self) -> int:
        """Events in the next submission: one (IngestEvent) or a batch (IngestEvents)."""
        return 1 if self.rng.random() < 0.6 else self.rng.randint(2, 6)

    def pause(self) -> float:
        """Seconds between submissions."""
        return self.rng.uniform(0.15, 0.6)

    def resend(self) -> bool:
        """Whether to re-send an event already acknowledged (a provider's retry)."""
        return self.rng.random() < 0.1


@dataclass
class SoakPlan:
    seed: int
    crashes: list[Crash] = field(default_factory=list)

    def stream(self, producer: int) -> RunStream:
        return RunStream(self.seed, producer, random.Random(f"{self.seed}-producer-{producer}"))

    def worker_to_kill(self, n: int) -> int:
        return random.Random(f"{self.seed}-kill-{n}").randrange(WORKERS)


def make_plan(seed: int | None = None) -> SoakPlan:
    if seed is None:
        seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(1, 1_000_000))
    rng = random.Random(seed)
    plan = SoakPlan(seed)
    # workers: one SIGKILL every 5-10 s, back after 0.3-2 s
    t = rng.uniform(3, 6)
    while t < LOAD_SECONDS - 4:
        plan.crashes.append(Crash(t, "worker", rng.uniform(0.3, 2.0)))
        t += rng.uniform(5, 10)
    # the scheduler twice, Postgres once, never at the same time
    plan.crashes.append(Crash(rng.uniform(6, 12), "scheduler", rng.uniform(0.5, 2.0)))
    plan.crashes.append(Crash(rng.uniform(18, 24), "postgres", 0.0))
    plan.crashes.append(Crash(rng.uniform(30, 38), "scheduler", rng.uniform(0.5, 2.0)))
    plan.crashes.sort(key=lambda c: c.at)
    return plan
