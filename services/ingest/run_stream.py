"""A run's event stream as server-sent events: `GET /v1/runs/<run_id>/events` on ingest's HTTP
server (docs/channels.md, "Watching a run over HTTP").

Transport only: the stream is the scheduler's WatchRun, called with the caller's own bearer key
(so it is authenticated and authorized exactly as over gRPC: another project's run is 404).
Each row of the run's log is one SSE event (`id:` its offset, `event:` state, step or progress,
`data:` the row as JSON); the last is `event: end` with the ended run, output included. A client
that reconnects with `Last-Event-ID` (or `?after=<offset>`) resumes after that offset. Errors
before the stream starts are problem documents with the gRPC status's HTTP code and reason.

With `?tokens=1` (and optionally `&stream=<name>`) the run's streamed tokens come too (WatchRun's
token tail): `event: tokens` (a batch), `token_gap` (tokens missed live) and `token_channel` (the
live channel gone or back). A token frame's id is `<offset>:<attempt>:<seq>` (the last log offset
sent, the last token's attempt and seq), so a client that reconnects with it resumes both.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
from aiohttp import web
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common import errors, jsonvalues
from services.common.peers import peer_channel
from services.common.settings import Settings

ROUTE = "/v1/runs/{run_id}/events"
LAST_EVENT_ID = "Last-Event-ID"
MAX_OFFSET = 2**63 - 1  # WatchRunRequest.after is an int64; a run's log offsets are positive
KEEPALIVE_SECONDS = 15.0  # a comment line this often while no event comes (idle timeouts of proxies)
SOURCES = {
    scheduler_pb2.RUN_EVENT_SOURCE_STATE: "state",
    scheduler_pb2.RUN_EVENT_SOURCE_STEP: "step",
    scheduler_pb2.RUN_EVENT_SOURCE_PROGRESS: "progress",
}


def service_error(err: grpc.aio.AioRpcError) -> errors.ServiceError:
    """The scheduler's answer as the ServiceError it was raised as (reason, metadata, violations)."""
    reason, metadata, violations = errors.INTERNAL, {}, []
    status = rpc_status.from_call(err)  # type: ignore[arg-type]  # an AioRpcError is a finished Call
    for detail in status.details if status is not None else []:
        info = error_details_pb2.ErrorInfo()
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(info):
            reason, metadata = info.reason, dict(info.metadata)
        elif detail.Unpack(bad):
            violations = [(v.field, v.description) for v in bad.field_violations]
    if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and status is None:
        reason = errors.STORE_UNAVAILABLE  # the scheduler could not be reached: retry later
    return errors.ServiceError(err.code(), reason, err.details() or "", metadata=metadata, violations=violations)


def _sse(event: str, data: dict[str, Any], ident: int | str | None = None) -> bytes:
    head = f"id: {ident}\n" if ident is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _offset(request: web.Request) -> tuple[int, int, int]:
    """The offset to resume after and the last token (attempt, seq): Last-Event-ID (`<offset>` or
    a token frame's `<offset>:<attempt>:<seq>`), else ?after=, else 0; INVALID_ARGUMENT (400)
    naming the one given unless it is an id the stream could have sent (offsets 0 to 2^63 - 1)."""
    if request.headers.get(LAST_EVENT_ID, "").strip():
        field, raw = f"headers.{LAST_EVENT_ID}", request.headers[LAST_EVENT_ID]
    else:
        field, raw = "query.after", request.query.get("after", "") or "0"
    parts = raw.strip().split(":")
    try:
        nums = [int(p) if p.isdigit() else -1 for p in parts] if len(parts) in (1, 3) else [-1]
    except ValueError:  # more digits than int() reads
        nums = [-1]
    if not all(0 <= n <= MAX_OFFSET for n in nums) or (len(nums) == 3 and nums[1] > 2**31 - 1):
        raise errors.invalid([(field, "must be an offset (a whole number) or a token id the stream sent as id")])
    return (nums[0], 0, 0) if len(nums) == 1 else (nums[0], nums[1], nums[2])


def _token_frame(msg: scheduler_pb2.WatchRunResponse, offset: int) -> bytes:
    """A token item of the watch (WatchRunRequest.tokens) as an SSE frame."""
    if msg.HasField("token_batch"):
        b = msg.token_batch
        last = b.first_seq + len(b.tokens) - 1
        body: dict[str, Any] = {
            "stream": b.stream,
            "attempt": b.attempt,
            "first_seq": b.first_seq,
            "tokens": list(b.tokens),
            "produced_at": b.produced_at.ToJsonString() if b.HasField("produced_at") else None,
            "from_checkpoint": b.from_checkpoint,
        }
        return _sse("tokens", body, f"{offset}:{b.attempt}:{last}")
    if msg.HasField("token_gap"):
        g = msg.token_gap
        gap = {"stream": g.stream, "attempt": g.attempt, "from_seq": g.from_seq, "to_seq": g.to_seq, "reason": g.reason}
        return _sse("token_gap", gap, f"{offset}:{g.attempt}:{g.to_seq}")
    return _sse("token_channel", {"live": msg.token_channel.live, "message": msg.token_channel.message})


def _frame(msg: scheduler_pb2.WatchRunResponse) -> bytes:
    """One WatchRun message as an SSE frame: an event under its source's name, or the ended run
    as the stream's last frame, `end`."""
    if msg.HasField("run"):
        run = json_format.MessageToDict(msg.run, preserving_proto_field_name=True)
        for name in ("input", "output"):  # 42, not 42.0, as the run was given them
            if msg.run.HasField(name):
                run[name] = jsonvalues.struct_dict(getattr(msg.run, name))
        return _sse("end", run)
    e = msg.event
    body: dict[str, Any] = {
        "offset": e.offset,
        "source": SOURCES.get(e.source, "unknown"),
        "kind": e.kind,
        "data": jsonvalues.struct_dict(e.data),
        "attempt": e.attempt,
        "at": e.at.ToJsonString(),
    }
    return _sse(body["source"], body, e.offset)


def _watch_request(request: web.Request) -> scheduler_pb2.WatchRunRequest:
    after, token_attempt, token_after = _offset(request)
    return scheduler_pb2.WatchRunRequest(
        run_id=request.match_info["run_id"],
        after=after,
        tokens=request.query.get("tokens", "") in ("1", "true"),
        token_stream=request.query.get("stream", ""),
        token_attempt=token_attempt,
        token_after=token_after,
    )


def add_routes(app: web.Application, settings: Settings) -> None:
    """Registers the stream route on ingest's HTTP app; the channel to the scheduler
    (Settings.scheduler_address: AWOOOP_SCHEDULER_ADDR, else its port on this host) opens on first use."""
    state: dict[str, scheduler_pb2_grpc.SchedulerServiceAsyncStub] = {}

    def scheduler() -> scheduler_pb2_grpc.SchedulerServiceAsyncStub:
        if "stub" not in state:
            channel = peer_channel(settings.scheduler_address(), settings.tls_cert_file)
            state["stub"] = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        return state["stub"]

    async def events(request: web.Request) -> web.StreamResponse:
        watch = _watch_request(request)
        after = watch.after
        metadata = (("authorization", request.headers.get("Authorization", "")),)
        call = scheduler().WatchRun(watch, metadata=metadata)
        try:
            await call.initial_metadata()  # the scheduler sends it once the watch is allowed
            if call.done() and await call.code() != grpc.StatusCode.OK:
                await call.read()  # raises the call's AioRpcError (answered below)
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            )
            await response.prepare(request)
            reading: asyncio.Future[Any] | None = None
            try:
                while True:
                    reading = reading or asyncio.ensure_future(call.read())
                    done, _ = await asyncio.wait({reading}, timeout=KEEPALIVE_SECONDS)
                    if not done:  # a comment line keeps proxies from closing an idle stream
                        await response.write(b": keepalive\n\n")
                        continue
                    msg, reading = reading.result(), None
                    if msg is grpc.aio.EOF:  # ended without the run (a scheduler that closed it): reconnect
                        break
                    if msg.HasField("event") or msg.HasField("run"):
                        after = msg.event.offset if msg.HasField("event") else after
                        await response.write(_frame(msg))
                    else:
                        await response.write(_token_frame(msg, after))
                    if msg.HasField("run"):
                        break
            except grpc.aio.AioRpcError as err:  # mid-stream: an SSE error event, then the client resumes
                failure = service_error(err)
                await response.write(_sse("error", {"code": failure.code.name, "reason": failure.reason}))
            finally:
                if reading is not None:
                    reading.cancel()
            await response.write_eof()
            return response
        except grpc.aio.AioRpcError as err:
            raise service_error(err) from None
        finally:
            call.cancel()

    app.router.add_get(ROUTE, events)
