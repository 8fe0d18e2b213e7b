"""The load generator: client work in separate processes, each with its own event loop and
its own channel (or pool), so client and server never share an event loop and one client
process is never the bottleneck alone.

Two layers:
- `run_processes(fn, kwargs_per_process)`: starts one process per kwargs, lets each set up
  (connect, warm the channel), releases them together with a shared start time, and
  collects what each returns. Used directly by the drain benchmarks (claims, PgQueuer).
- `run_load(kind, ...)`: N concurrent calls for T seconds, split over P processes. A *kind*
  is a class named by "module:Class" that builds and sends one request; the same generator
  runs the transport ceiling (health Check) and the RPC under test, so their ratio compares
  like with like. Only calls that complete inside the measured window count; the window
  starts after a warm-up.

CLOCK_MONOTONIC is system-wide on Linux, so start/end times are passed as monotonic stamps.
"""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing as mp
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from bench import cpu

_CTX = mp.get_context("spawn")  # never fork a process that may hold gRPC/asyncio state


def _import(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _entry(fn_path: str, kwargs: dict[str, Any], conn: Any, use_uvloop: bool) -> None:
    fn = _import(fn_path)

    async def sync(payload: Any = None) -> Any:
        conn.send(("ready", payload))
        return await asyncio.get_running_loop().run_in_executor(None, conn.recv)

    try:
        if use_uvloop:
            import uvloop

            result = uvloop.run(fn(sync=sync, **kwargs))
        else:
            result = asyncio.run(fn(sync=sync, **kwargs))
        conn.send(("result", result))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _recv(conn: Any, proc: Any, fn_path: str, timeout: float, what: str) -> tuple[str, Any]:
    if not conn.poll(timeout):
        raise RuntimeError(f"{fn_path}: a load process did not {what} in {timeout}s")
    try:
        return tuple(conn.recv())  # type: ignore[return-value]
    except EOFError:
        proc.join(5)
        raise RuntimeError(f"{fn_path}: a load process died (exit code {proc.exitcode})") from None


def run_processes(
    fn_path: str,
    kwargs_per_process: list[dict[str, Any]],
    go: Callable[[list[Any]], Any] = lambda readies: time.monotonic() + 0.05,
    *,
    use_uvloop: bool = True,
    timeout: float = 300.0,
) -> list[Any]:
    """Runs `async fn(sync, **kwargs)` in one process per kwargs. Each process calls
    `await sync(payload)` once it is set up; when all have, go(payloads) is sent to every one
    as sync's return value. Returns each process's result, in order."""
    pipes = []
    procs = []
    for kwargs in kwargs_per_process:
        parent, child = _CTX.Pipe()
        p = _CTX.Process(target=_entry, args=(fn_path, kwargs, child, use_uvloop), daemon=True)
        p.start()
        child.close()
        pipes.append(parent)
        procs.append(p)
    try:
        readies = []
        for conn, p in zip(pipes, procs, strict=True):
            kind, payload = _recv(conn, p, fn_path, timeout, "get ready")
            if kind == "error":
                raise RuntimeError(f"{fn_path} failed while setting up:\n{payload}")
            readies.append(payload)
        signal = go(readies)
        for conn in pipes:
            conn.send(signal)
        results = []
        for conn, p in zip(pipes, procs, strict=True):
            kind, payload = _recv(conn, p, fn_path, timeout, "finish")
            if kind == "error":
                raise RuntimeError(f"{fn_path} failed:\n{payload}")
            results.append(payload)
        return results
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)


class Caller(Protocol):
    """One kind of request. Built in the load process from the kind's params."""

    async def setup(self, proc_idx: int, workers: int) -> None: ...

    async def call(self, worker: int, n: int) -> int:
        """Sends request number n of this worker; returns the units it carried (events)."""
        ...

    async def close(self) -> None: ...


class Unexpected(Exception):
    """The call succeeded but its answer is not what the benchmark set up (e.g. a
    'duplicate' that was not answered as a duplicate): counted apart, never as throughput."""


async def timed_load(
    sync: Callable[[Any], Awaitable[Any]],
    kind: str,
    params: dict[str, Any],
    proc_idx: int,
    workers: int,
) -> dict[str, Any]:
    import grpc

    caller: Caller = _import(kind)(**params)
    await caller.setup(proc_idx, workers)
    warm_at, start_at, end_at = await sync(None)
    loop_time = time.monotonic
    calls = units = unexpected = 0
    errors: dict[str, int] = {}
    first_error = ""
    unimplemented = ""
    latencies: list[float] = []

    await asyncio.sleep(max(0.0, warm_at - loop_time()))
    cpu0 = time.process_time()

    async def worker(w: int) -> None:
        nonlocal calls, units, unexpected, first_error, unimplemented
        n = 0
        while True:
            t0 = loop_time()
            if t0 >= end_at:
                return
            try:
                got = await caller.call(w, n)
                ok = True
            except Unexpected as exc:
                ok = False
                t1 = loop_time()
                if start_at <= t1 <= end_at:
                    unexpected += 1
                    first_error = first_error or f"unexpected: {exc}"
            except grpc.aio.AioRpcError as exc:
                ok = False
                t1 = loop_time()
                if start_at <= t1 <= end_at:
                    errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                    first_error = first_error or f"{exc.code().name}: {exc.details()}"
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    unimplemented = exc.details() or "UNIMPLEMENTED"
                    return
            except Exception as exc:
                ok = False
                t1 = loop_time()
                if start_at <= t1 <= end_at:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    first_error = first_error or repr(exc)
            n += 1
            if ok:
                t1 = loop_time()
                if start_at <= t1 <= end_at:
                    calls += 1
                    units += got
                    latencies.append(t1 - t0)

    try:
        await asyncio.gather(*(worker(w) for w in range(workers)))
    finally:
        cpu = time.process_time() - cpu0
        await caller.close()
    return {
        "unimplemented": unimplemented,
        "client_cpu_s": cpu,
        "calls": calls,
        "units": units,
        "errors": errors,
        "unexpected": unexpected,
        "first_error": first_error,
        "latencies": latencies,
    }


@dataclass
class LoadResult:
    kind: str
    concurrency: int
    processes: int
    duration: float
    calls: int
    units: int
    errors: dict[str, int] = field(default_factory=dict)
    unexpected: int = 0
    first_error: str = ""
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    # CPU seconds the load processes used per second of load (1.0 = one core busy)
    client_cpu: float = 0.0
    # cores used during the window by the server process, Postgres, Redis, the machine (bench.cpu)
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.duration

    @property
    def units_per_s(self) -> float:
        return self.units / self.duration

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "concurrency": self.concurrency,
            "processes": self.processes,
            "duration_s": round(self.duration, 3),
            "calls": self.calls,
            "units": self.units,
            "calls_per_s": round(self.calls_per_s, 1),
            "units_per_s": round(self.units_per_s, 1),
            "errors": self.errors,
            "unexpected": self.unexpected,
            "first_error": self.first_error,
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "client_cpu_cores": round(self.client_cpu, 2),
            "cpu_cores": self.cpu,
        }


def split(concurrency: int, processes: int) -> list[int]:
    """Concurrency spread over at most `processes` processes (no process with 0 workers)."""
    processes = max(1, min(processes, concurrency))
    base, extra = divmod(concurrency, processes)
    return [base + (1 if i < extra else 0) for i in range(processes)]


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def run_load(
    kind: str,
    params: dict[str, Any],
    *,
    concurrency: int,
    processes: int,
    duration: float,
    warmup: float = 0.5,
    use_uvloop: bool = True,
    server_pid: int | None = None,
) -> LoadResult:
    """`concurrency` requests in flight for `duration` seconds (after `warmup`), over
    `processes` load processes. Raises when a call kind is not implemented by the server.
    The CPU used in the window (server_pid's, Postgres', Redis', the machine's) is recorded."""
    shares = split(concurrency, processes)
    kwargs = [{"kind": kind, "params": params, "proc_idx": i, "workers": workers} for i, workers in enumerate(shares)]

    snaps: list[cpu.Snapshot] = []

    def sample(start_at: float, end_at: float) -> None:
        time.sleep(max(0.0, start_at - time.monotonic()))
        snaps.append(cpu.snapshot(server_pid))
        time.sleep(max(0.0, end_at - time.monotonic()))
        snaps.append(cpu.snapshot(server_pid))

    sampler: threading.Thread | None = None

    def go(_: list[Any]) -> tuple[float, float, float]:
        nonlocal sampler
        warm_at = time.monotonic() + 0.1
        start_at, end_at = warm_at + warmup, warm_at + warmup + duration
        sampler = threading.Thread(target=sample, args=(start_at, end_at), daemon=True)
        sampler.start()
        return warm_at, start_at, end_at

    results = run_processes("bench.loadgen:timed_load", kwargs, go, use_uvloop=use_uvloop)
    if sampler is not None:
        sampler.join()
    unimplemented = next((r["unimplemented"] for r in results if r["unimplemented"]), "")
    if unimplemented:
        raise NotImplementedError(f"{kind.rpartition(':')[2]}: the server answers UNIMPLEMENTED ({unimplemented})")
    errors: dict[str, int] = {}
    lat: list[float] = []
    for r in results:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
        lat.extend(r["latencies"])
    lat.sort()
    out = LoadResult(
        kind=kind.rpartition(":")[2],
        concurrency=concurrency,
        processes=len(shares),
        duration=duration,
        calls=sum(r["calls"] for r in results),
        units=sum(r["units"] for r in results),
        errors=errors,
        unexpected=sum(r["unexpected"] for r in results),
        first_error=next((r["first_error"] for r in results if r["first_error"]), ""),
        p50_ms=_percentile(lat, 0.5) * 1000,
        p99_ms=_percentile(lat, 0.99) * 1000,
        # client CPU is measured over warm-up + window in each process
        client_cpu=sum(r["client_cpu_s"] for r in results) / (warmup + duration),
        cpu=cpu.cores(snaps[0], snaps[1], duration) if len(snaps) == 2 else {},
    )
    return out


# ---------------------------------------------------------------- the transport ceiling


class HealthCheck:
    """grpc.health.v1.Health/Check on a service's own server: the cheapest unary call that
    server can answer (no auth, no store), so calls/s of it is the transport ceiling for
    that server, client and concurrency."""

    def __init__(self, address: str) -> None:
        self.address = address

    async def setup(self, proc_idx: int, workers: int) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        self.channel = grpc.aio.insecure_channel(self.address)
        await self.channel.channel_ready()
        self.stub = health_pb2_grpc.HealthStub(self.channel)
        self.request = health_pb2.HealthCheckRequest(service="")

    async def call(self, worker: int, n: int) -> int:
        await self.stub.Check(self.request, timeout=30)
        return 1

    async def close(self) -> None:
        await self.channel.close()
