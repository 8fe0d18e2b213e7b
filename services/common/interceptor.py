"""The service interceptor: authentication, error mapping, metrics and access log.

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
from typing import TYPE_CHECKING, Any, cast

import grpc

from services.common import errors, tracing
from services.common.auth import Authenticator, reset_principal, set_principal
from services.common.db import store_error
from services.common.observability import RUN_ID, RpcMetrics, run_id_getter

log = logging.getLogger("awooop.rpc")

PUBLIC_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


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
        if not method.startswith(PUBLIC_PREFIXES) and handler.unary_unary is not None:
            handler = grpc.unary_unary_rpc_method_handler(
                # on a grpc.aio server the handlers are coroutine functions taking an aio context
                self._wrap(method, cast("AioUnary", handler.unary_unary)),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        elif not method.startswith(PUBLIC_PREFIXES) and handler.unary_stream is not None:
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
            started = time.perf_counter()
            rpc.started.inc()
            code = "OK"
            principal_id = ""
            token = None
            # Failures are answered after the metrics and the log are written (below the
            # try), so a caller that sees the status also sees it counted.
            failure: errors.ServiceError | None = None
            self.in_flight += 1
            named = run_of is not None and type(request) is not Malformed  # a Malformed request names nothing
            run_token = RUN_ID.set(run_of(request)) if named else None  # type: ignore[misc]
            try:
                if limit and self.in_flight > limit:
                    raise errors.overloaded(limit)
                if type(request) is Malformed:  # answered like any bad input: counted, logged, ErrorInfo
                    raise errors.malformed_request(method, request.detail)
                if authenticator is not None:
                    principal = await authenticator.authenticate(_authorization(context))
                    principal_id = principal.principal_id
                    token = set_principal(principal)
                return await inner(request, context)
            except errors.ServiceError as exc:
                failure = exc
            except grpc.aio.AbortError:
                code = context.code().name if context.code() else "ABORTED"
                raise
            except asyncio.CancelledError:
                # the client went away or its deadline passed; grpc already answered it
                remaining = context.time_remaining()
                code = "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"
                raise
            except NotImplementedError:  # the generated base servicer's answer
                failure = errors.unimplemented(method)
            except Exception as exc:
                failure = store_error(exc)
                if failure is None:
                    log.exception("unhandled error in %s", method)
                    tracing.record_exception(exc)  # on the call's span (tracing on), not in the answer
                    failure = errors.internal()
            finally:
                self.in_flight -= 1
                if failure is not None:
                    code = failure.code.name
                if token is not None:
                    reset_principal(token)
                elapsed = time.perf_counter() - started
                rpc.handled(code, elapsed)
                if access_log:
                    log.info(
                        "rpc",
                        extra={
                            "method": method,
                            "code": code,
                            "ms": round(elapsed * 1000, 2),
                            "principal": principal_id,
                            "peer": context.peer(),
                        },
                    )
                if run_token is not None:
                    RUN_ID.reset(run_token)
            assert failure is not None  # the try either returned, raised, or set it
            status = failure.to_status()
            await context.abort(status.code, status.details, status.trailing_metadata)

        return handle

    def _wrap_stream(self, method: str, inner: AioStream) -> Any:
        """A server-streaming handler: authenticated, its failure mapped like a unary one's (also
        after messages were sent: the status ends the stream), counted and logged when it ends."""
        authenticator = self.authenticator if self.authenticate else None
        access_log = self.access_log
        rpc = RpcMetrics(method)
        run_of = run_id_getter(method)

        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            started = time.perf_counter()
            rpc.started.inc()
            code = "OK"
            principal_id = ""
            token = None
            failure: errors.ServiceError | None = None
            named = run_of is not None and type(request) is not Malformed
            run_token = RUN_ID.set(run_of(request)) if named else None  # type: ignore[misc]
            try:
                if type(request) is Malformed:
                    raise errors.malformed_request(method, request.detail)
                if authenticator is not None:
                    principal = await authenticator.authenticate(_authorization(context))
                    principal_id = principal.principal_id
                    token = set_principal(principal)
                async for item in inner(request, context):
                    yield item
            except errors.ServiceError as exc:
                failure = exc
            except grpc.aio.AbortError:
                code = context.code().name if context.code() else "ABORTED"
                raise
            except asyncio.CancelledError:
                remaining = context.time_remaining()
                code = "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"
                raise
            except NotImplementedError:
                failure = errors.unimplemented(method)
            except Exception as exc:
                failure = store_error(exc)
                if failure is None:
                    log.exception("unhandled error in %s", method)
                    tracing.record_exception(exc)
                    failure = errors.internal()
            finally:
                if failure is not None:
                    code = failure.code.name
                if token is not None:
                    reset_principal(token)
                elapsed = time.perf_counter() - started
                rpc.handled(code, elapsed)
                if access_log:
                    log.info(
                        "rpc",
                        extra={
                            "method": method,
                            "code": code,
                            "ms": round(elapsed * 1000, 2),
                            "principal": principal_id,
                            "peer": context.peer(),
                        },
                    )
                if run_token is not None:
                    RUN_ID.reset(run_token)
            if failure is not None:
                status = failure.to_status()
                await context.abort(status.code, status.details, status.trailing_metadata)

        return handle
