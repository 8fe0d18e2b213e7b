"""The service interceptor: authentication, error mapping, metrics and access log (at DEBUG).

Handlers raise ServiceError (or let a store failure propagate); this turns it into a
status with google.rpc details. A method the servicer does not implement (the generated
base raises NotImplementedError) answers UNIMPLEMENTED with ErrorInfo, never a fake
answer. Anything else is a bug: logged with its traceback and answered INTERNAL without
leaking the exception text.

Unary-unary handlers are wrapped, and the one unary-stream kind awooop serves (WatchRun): its
stream is authenticated, counted and logged once, when it ends (it does not count against
AWOOOP_MAX_CONCURRENT_RPCS: a watch is long-lived and has its own limit). Health and reflection
(streaming, and public: docs/architecture.md, "Security and errors") pass through untouched.

With tracing on, opentelemetry-instrumentation-grpc's server interceptor comes before this one
(services/common/tracing.py): its span is current around everything here, and it sees the
answer through the servicer context it wraps, whose `abort` it records (code and status) but
not `abort_with_status` (grpc's goes to the unwrapped context). So a failure is answered with
`abort` and the status's parts: an abort, not a returned code, because only an abort is sent
trailers-only, which a client's retry policy may retry (UNAVAILABLE / OVERLOADED).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, cast

import grpc

from services.common import errors, tracing
from services.common.auth import Authenticator, Principal, reset_principal, set_principal
from services.common.db import store_error
from services.common.observability import RUN_ID, RpcMetrics, run_id_getter
from services.common.public_methods import is_public

log = logging.getLogger("awooop.rpc")

if TYPE_CHECKING:  # grpc's classes are generic only in their stubs
    Handler = grpc.RpcMethodHandler[Any, Any]
    AioUnary = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]
    AioStream = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]


class Malformed:
    """Stands in for a request whose bytes did not decode, so the handler answers it (grpc
    itself would answer UNKNOWN "Unexpected DecodeError", unlogged and uncounted)."""

    __slots__ = ("detail",)

    def __init__(self, detail: str) -> None:
        self.detail = detail


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # DecodeError, and RecursionError-like limits of the decoder
            return Malformed(str(exc)[:200] or type(exc).__name__)

    return decode


def _authorization(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The call's `authorization` metadata (the last one, should several come)."""
    found = None
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str):  # only "-bin" keys carry bytes
            found = value
    return found


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        authenticator: Authenticator,
        access_log: bool = True,
        *,
        authenticate: bool = True,
        max_concurrent_rpcs: int = 0,
    ) -> None:
        self.authenticator = authenticator
        # past this many RPCs in flight a call is refused UNAVAILABLE / OVERLOADED before any work
        # (0: no limit); counted and logged like every answer
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self.in_flight = 0
        self.access_log = access_log
        # False for public services (the reference gateway): no key asked, the rest applies
        self.authenticate = authenticate
        # method -> the handler to serve it with, built on its first call: a server's handlers
        # are registered before it starts and never change, so one wrapper per method will do
        self._handlers: dict[str, Handler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        method: str = details.method
        cached = self._handlers.get(method)
        if cached is not None:
            return cached
        handler = await continuation(details)
        if handler is None:  # unknown method: grpc answers UNIMPLEMENTED; not cached (any name can come)
            return handler
        if not is_public(method) and handler.unary_unary is not None:
            handler = grpc.unary_unary_rpc_method_handler(
                # on a grpc.aio server the handlers are coroutine functions taking an aio context
                self._wrap(method, cast("AioUnary", handler.unary_unary)),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        elif not is_public(method) and handler.unary_stream is not None:
            handler = grpc.unary_stream_rpc_method_handler(
                # an async generator function taking an aio context
                self._wrap_stream(method, cast("AioStream", handler.unary_stream)),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        self._handlers[method] = handler
        return handler

    def _wrap(self, method: str, inner: AioUnary) -> Any:
        authenticator = self.authenticator if self.authenticate else None
        access_log = self.access_log
        limit = self.max_concurrent_rpcs
        rpc = RpcMetrics(method)  # grpc_server_* children of this method, bound once
        run_of = run_id_getter(method)  # log lines of its RPCs carry the run the request names

        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            with _Call(method, rpc, run_of, request, context, access_log, self) as call:
                await call.admit(request, authenticator, limit)
                return await inner(request, context)
            await call.answer()  # reached only with the failure the call kept

        return handle

    def _wrap_stream(self, method: str, inner: AioStream) -> Any:
        """A server-streaming handler: authenticated, its failure mapped like a unary one's (also
        after messages were sent: the status ends the stream), counted and logged when it ends."""
        authenticator = self.authenticator if self.authenticate else None
        access_log = self.access_log
        rpc = RpcMetrics(method)
        run_of = run_id_getter(method)

        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            with _Call(method, rpc, run_of, request, context, access_log, None) as call:
                await call.admit(request, authenticator, 0)
                async for item in inner(request, context):
                    yield item
            if call.failure is not None:
                await call.answer()

        return handle


class _Call:
    """One RPC around its handler, unary or streaming alike. Entering counts it started (and in
    flight, for the unary calls the concurrency limit counts) and names its run for the log lines;
    `admit` refuses a call that must not run (over the limit, malformed, not authenticated); the
    block's end maps what it raised to a status, counts it and writes the access-log line. A
    failure is kept, not raised, and answered after the block (`answer`), so a caller that sees
    the status also sees it counted. An abort the handler made and a cancelled call (the client
    left or its deadline passed: grpc already answered) are counted under their code and go on."""

    __slots__ = (
        "_access_log", "_code", "_context", "_counter", "_method", "_principal", "_principal_id", "_request", "_rpc",
        "_run", "_run_of", "_started", "failure",
    )  # fmt: skip

    def __init__(
        self,
        method: str,
        rpc: RpcMetrics,
        run_of: Callable[[Any], str] | None,
        request: Any,
        context: grpc.aio.ServicerContext[Any, Any],
        access_log: bool,
        counter: ServiceInterceptor | None,
    ) -> None:
        self.failure: errors.ServiceError | None = None
        self._method = method
        self._rpc = rpc
        self._run_of = run_of
        self._request = request
        self._context = context
        self._access_log = access_log
        self._counter = counter  # the interceptor whose in_flight counts this call (None: not counted)
        self._code = "OK"
        self._principal_id = ""
        self._principal: Token[Principal | None] | None = None
        self._run: Token[str] | None = None
        self._started = 0.0

    def __enter__(self) -> _Call:
        self._started = time.perf_counter()
        self._rpc.started.inc()
        if self._counter is not None:
            self._counter.in_flight += 1
        if self._run_of is not None and type(self._request) is not Malformed:  # a Malformed request names nothing
            self._run = RUN_ID.set(self._run_of(self._request))
        return self

    async def admit(self, request: Any, authenticator: Authenticator | None, limit: int) -> None:
        if limit and self._counter is not None and self._counter.in_flight > limit:
            raise errors.overloaded(limit)
        if type(request) is Malformed:  # answered like any bad input: counted, logged, ErrorInfo
            raise errors.malformed_request(self._method, request.detail)
        if authenticator is not None:
            principal = await authenticator.authenticate(_authorization(self._context))
            self._principal_id = principal.principal_id
            self._principal = set_principal(principal)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if exc is None:
            pass
        elif isinstance(exc, errors.ServiceError):
            self.failure = exc
        elif isinstance(exc, grpc.aio.AbortError):
            code = self._context.code()
            self._code = code.name if code else "ABORTED"
        elif isinstance(exc, asyncio.CancelledError):
            remaining = self._context.time_remaining()
            self._code = "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"
        elif isinstance(exc, NotImplementedError):  # the generated base servicer's answer
            self.failure = errors.unimplemented(self._method)
        elif isinstance(exc, Exception):
            self.failure = store_error(exc)
            if self.failure is None:
                log.error("unhandled error in %s", self._method, exc_info=exc)
                tracing.record_exception(exc)  # on the call's span (tracing on), not in the answer
                self.failure = errors.internal()
        self._end()
        return self.failure is not None  # kept for answer(); aborts, cancels and the rest go on

    def _end(self) -> None:
        if self._counter is not None:
            self._counter.in_flight -= 1
        if self.failure is not None:
            self._code = self.failure.code.name
        if self._principal is not None:
            reset_principal(self._principal)
        elapsed = time.perf_counter() - self._started
        self._rpc.handled(self._code, elapsed)
        # at DEBUG: a line per call buried everything else a process says (AWOOOP_LOG_LEVEL=DEBUG shows them);
        # failures are counted by code in grpc_server_handled_total, and a bug is logged at ERROR above
        if self._access_log and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "rpc",
                extra={
                    "method": self._method,
                    "code": self._code,
                    "ms": round(elapsed * 1000, 2),
                    "principal": self._principal_id,
                    "peer": self._context.peer(),
                },
            )
        if self._run is not None:
            RUN_ID.reset(self._run)

    async def answer(self) -> NoReturn:
        assert self.failure is not None  # only a kept failure is answered
        status = self.failure.to_status()
        await self._context.abort(status.code, status.details, status.trailing_metadata)
