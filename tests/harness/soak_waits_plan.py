"""The waits soak's seeded plan (tests/test_waits_soak.py): its projects and their flow settings,
each submitted run's kind (a plain run, a durable wait completed by its callback URL or by RPC,
one that times out, a sleep, a fan-out to child runs) and outcome, and when workers are killed.
Everything random comes from one `random.Random` per stream, seeded as the invariant soak's
(AWOOOP_SOAK_SEED repeats a plan)."""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.harness.soak_plan import SEED_ENV, Limit, Project

LOAD_SECONDS = 30.0
RESUME_AT = 12.0  # the paused project is resumed, with time left to drain it
WORKERS = 3

# a run's kind -> weight
KINDS = {"plain": 20, "url": 20, "rpc": 20, "timeout": 10, "sleep": 10, "children": 20}
# a plain run's (and a child's) handler outcome -> weight
OUTCOMES = {"ok": 70, "flaky": 15, "fatal": 15}

# error codes the soak's worker (tests/soak_waits_worker.py) and the SDK end runs with
FATAL_CODE = "E-SOAK-FATAL"
REJECTED_CODE = "E-SOAK-REJECTED"  # a wait completed with {"verdict": "reject"}
CHILD_CODE = "E-SOAK-CHILD"  # a parent one of whose children did not complete
TIMEOUT_CODE = "E-WAIT-TIMEOUT"  # the SDK's, for a wait timeout the handler left uncaught
MAX_ATTEMPTS_CODE = "E-RUN-MAX-ATTEMPTS"  # the reaper's, for a run whose leases kept expiring

PROJECTS = (
    Project(
        "ws-a", weight=2, initial_backoff=0.2, max_backoff=1.0, max_attempts=5, limits=(Limit("db", 2, share=0.3),)
    ),
    # paused until RESUME_AT, with a key that also limits its starts per second
    Project(
        "ws-b",
        weight=1,
        initial_backoff=0.1,
        max_backoff=0.5,
        max_attempts=5,
        limits=(Limit("llm", 3, max_starts=10, per_seconds=1.0, share=0.5),),
        paused=True,
    ),
    Project("ws-c", weight=1, max_attempts=5, schedules=(("tick-c", "*/2 * * * * *"),)),
)
PAUSED = next(p.name for p in PROJECTS if p.paused)


@dataclass(frozen=True)
class RunPlan:
    event_id: str
    project: str
    kind: str
    outcome: str = "ok"  # plain runs and children
    work_ms: int = 100
    keys: tuple[str, ...] = ()
    priority: int = 0
    verdict: str = ""  # url / rpc: what the completion posts ("ok" or "reject")
    complete_after: float = 0.0  # url / rpc: seconds after the wait was created
    timeout: float = 0.0  # url / rpc / timeout: the wait's
    seconds: float = 0.0  # sleep
    flaky_after: bool = False  # url / rpc: the attempt that receives the outcome fails once
    children: tuple[str, ...] = ()  # children: each child's outcome, in order
    cancel_after: float = 0.0  # children: an operator cancels the parent this long after it was acknowledged

    def input(self) -> dict[str, Any]:
        """What the worker reads (input.soak): the plan without its routing."""
        plan = asdict(self)
        for routing in ("event_id", "project", "keys", "priority", "cancel_after"):
            plan.pop(routing)
        plan["children"] = list(self.children)
        return {"soak": plan}


@dataclass(frozen=True)
class Kill:
    at: float  # seconds into the load
    worker: int
    down_for: float


@dataclass
class RunStream:
    """One producer's runs, from its own generator."""

    seed: int
    producer: int
    rng: random.Random
    _n: int = 0

    def next_run(self) -> RunPlan:
        self._n += 1
        rng = self.rng
        project = rng.choice(PROJECTS)
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        base: dict[str, Any] = {
            "event_id": f"ws-{self.seed}-{self.producer}-{self._n}",
            "project": project.name,
            "kind": kind,
            "work_ms": rng.randint(30, 300),
            "keys": tuple(limit.key for limit in project.limits if rng.random() < limit.share),
            "priority": rng.choice([0, 0, 5, -5]),
        }
        if kind == "plain":
            base["outcome"] = _outcome(rng)
        elif kind in ("url", "rpc"):
            base |= {
                "verdict": "reject" if rng.random() < 0.25 else "ok",
                "complete_after": round(rng.uniform(0.0, 1.5), 2),
                "timeout": 60.0,
                "flaky_after": rng.random() < 0.2,
            }
        elif kind == "timeout":
            base["timeout"] = round(rng.uniform(0.5, 2.0), 2)
        elif kind == "sleep":
            base["seconds"] = round(rng.uniform(0.2, 1.5), 2)
        else:
            base["children"] = tuple(_outcome(rng, flaky=False) for _ in range(rng.randint(2, 3)))
            if rng.random() < 0.5:  # cancelled while its children run (or before, or after it ended)
                base["cancel_after"] = round(rng.uniform(0.05, 0.8), 2)
        return RunPlan(**base)

    def pause(self) -> float:
        """Seconds between submissions."""
        return self.rng.uniform(0.2, 0.6)


def _outcome(rng: random.Random, *, flaky: bool = True) -> str:
    names = [o for o in OUTCOMES if flaky or o != "flaky"]
    return rng.choices(names, weights=[OUTCOMES[o] for o in names])[0]


@dataclass
class SoakPlan:
    seed: int
    kills: list[Kill] = field(default_factory=list)

    def stream(self, producer: int) -> RunStream:
        return RunStream(self.seed, producer, random.Random(f"{self.seed}-waits-producer-{producer}"))


def make_plan(seed: int | None = None) -> SoakPlan:
    if seed is None:
        seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(1, 1_000_000))
    rng = random.Random(f"{seed}-waits")
    plan = SoakPlan(seed)
    # a worker SIGKILLed every 3-6 s, back after 0.3-1.5 s
    t = rng.uniform(2, 4)
    while t < LOAD_SECONDS - 2:
        plan.kills.append(Kill(t, rng.randrange(WORKERS), rng.uniform(0.3, 1.5)))
        t += rng.uniform(3, 6)
    return plan


def expected(plan: RunPlan, children_completed: bool) -> tuple[str, str]:
    """(status, error code) the plan's run ends with when no lease of it ran out of attempts."""
    if plan.kind == "plain":
        return ("FAILED", FATAL_CODE) if plan.outcome == "fatal" else ("COMPLETED", "")
    if plan.kind in ("url", "rpc"):
        return ("FAILED", REJECTED_CODE) if plan.verdict == "reject" else ("COMPLETED", "")
    if plan.kind == "timeout":
        return "FAILED", TIMEOUT_CODE
    if plan.kind == "children":
        return ("COMPLETED", "") if children_completed else ("FAILED", CHILD_CODE)
    return "COMPLETED", ""
