"""A real gRPC proxy in front of a real service that makes chosen calls slow, lost or refused.

It forwards every unary call to the target as raw bytes (metadata and deadline included), so
the client and the service talk protobuf over real channels as ever; faults are queued per
method (the short name, e.g. "CompleteRuns") and each one serves one call, in order:

- fail(code): answered with code; the call never reaches the service
- hang(): never answered; the call ends by the client's deadline (DEADLINE_EXCEEDED)
- lose_answer(code): forwarded (the service did it), then answered with code instead
- hold_answer(): forwarded, then its answer is held until `release` is set; `answered` is set
  once the service answered

A client that cancels a call is counted in `cancelled`. Streaming methods (health Watch) are
not served: the client's health checking then treats the proxy as healthy (UNIMPLEMENTED).
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict, deque
from dataclasses import dataclass
from typing import Any

import grpc

FAIL, HANG, LOSE_ANSWER, HOLD_ANSWER = "fail", "hang", "lose_answer", "hold_answer"
STREAMING = ("/grpc.health.v1.Health/Watch",)


@dataclass(frozen=True)
class Fault:
    kind: str
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE


def fail(code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> Fault:
    return Fault(FAIL, code)


def hang() -> Fault:
    return Fault(HANG)


def lose_answer(code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> Fault:
    return Fault(LOSE_ANSWER, code)


def hold_answer() -> Fault:
    return Fault(HOLD_ANSWER)


class RpcProxy:
    def __init__(self, target: str) -> None:
        self.target = target
        self.faults: dict[str, deque[Fault]] = defaultdict(deque)
        self.always: dict[str, Fault] = {}  # a fault for every call of the method (after the queued ones)
        self.calls: Counter[str] = Counter()  # calls seen, by method
        self.faulted: Counter[str] = Counter()  # calls a fault was applied to, by method
        self.cancelled: Counter[str] = Counter()  # calls the client cancelled, by method
        self.answered = asyncio.Event()
        self.release = asyncio.Event()
        self._channel = grpc.aio.insecure_channel(target)
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((_Handlers(self),))
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def add(self, method: str, *faults: Fault) -> None:
        self.faults[method].extend(faults)

    async def start(self) -> RpcProxy:
        await self._server.start()
        return self

    async def stop(self) -> None:
        await self._server.stop(None)
        await self._channel.close()

    def _next_fault(self, method: str) -> Fault | None:
        queued = self.faults.get(method)
        if queued:
            return queued.popleft()
        return self.always.get(method)

    async def forward(self, full_method: str, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        method = full_method.rsplit("/", 1)[-1]
        self.calls[method] += 1
        fault = self._next_fault(method)
        if fault is not None:
            self.faulted[method] += 1
        try:
            if fault is not None and fault.kind == FAIL:
                await context.abort(fault.code, f"proxy: {method} failed on purpose")
            if fault is not None and fault.kind == HANG:
                await asyncio.Event().wait()  # until the client's deadline cancels this call
            remaining = context.time_remaining()
            answer: bytes = await self._channel.unary_unary(full_method)(
                request, metadata=_forwardable(context.invocation_metadata()), timeout=remaining
            )
            if fault is not None and fault.kind == LOSE_ANSWER:
                await context.abort(fault.code, f"proxy: {method} answer lost on purpose")
            if fault is not None and fault.kind == HOLD_ANSWER:
                self.answered.set()
                await self.release.wait()
            return answer
        except grpc.aio.AioRpcError as err:
            # a target that died mid-call leaves no trailing metadata, which abort() refuses as None
            await context.abort(err.code(), err.details() or "", tuple(err.trailing_metadata() or ()))
            raise  # not reached: abort raises
        except asyncio.CancelledError:
            self.cancelled[method] += 1
            raise


def _forwardable(metadata: Any) -> tuple[tuple[str, Any], ...]:
    """The client's metadata minus what gRPC sets itself on the forwarded call."""
    return tuple((k, v) for k, v in (metadata or ()) if not k.startswith(("grpc-", ":")) and k != "user-agent")


class _Handlers(grpc.GenericRpcHandler):
    def __init__(self, proxy: RpcProxy) -> None:
        self.proxy = proxy

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        if method in STREAMING:
            return None

        async def unary(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            return await self.proxy.forward(method, request, context)

        return grpc.unary_unary_rpc_method_handler(unary)
