"""The one server interceptor: authentication, error mapping, metrics and access log.

Handlers raise ServiceError (or let a store failure propagate); this turns it into a
status with google.rpc details. A method the servicer does not implement (the generated
base raises NotImplementedError) answers UNIMPLEMENTED with ErrorInfo, never a fake
answer. Anything else is a bug: logged with its traceback and answered INTERNAL without
leaking the exception text.

Only unary-unary handlers are wrapped: every awooop RPC is unary. Health and reflection
(streaming, and public by ARCHITECTURE.md section 7) pass through untouched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from services.common import errors
from services.common.auth import Authenticator, reset_principal, set_principal
from services.common.db import store_error
from services.common.observability import RUN_ID, RpcMetrics, run_id_getter

log = logging.getLogger("awooop.rpc")

PUBLIC_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, authenticator: Authenticator, access_log: bool = True, *, authenticate: bool = True) -> None:
        self.authenticator = authenticator
        self.access_log = access_log
        # False for public services (the reference gateway): no key asked, the rest applies
        self.authenticate = authenticate
        # method -> the handler to serve it with, built on its first call: a server's handlers
        # are registered before it starts and never change, so one wrapper per method will do
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method: str = details.method  # type: ignore[attr-defined]
        cached = self._handlers.get(method)
        if cached is not None:
            return cached
        handler = await continuation(details)
        if handler is None:  # unknown method: grpc answers UNIMPLEMENTED; not cached (any name can come)
            return handler
        if not method.startswith(PUBLIC_PREFIXES) and handler.unary_unary is not None:  # every awooop RPC is unary
            handler = grpc.unary_unary_rpc_method_handler(
                self._wrap(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        self._handlers[method] = handler
        return handler

    def _wrap(self, method: str, inner: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]) -> Any:
        authenticator = self.authenticator if self.authenticate else None
        access_log = self.access_log
        rpc = RpcMetrics(method)  # grpc_server_* children of this method, bound once
        run_of = run_id_getter(method)  # log lines of its RPCs carry the run the request names

        async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            rpc.started.inc()
            code = "OK"
            principal_id = ""
            token = None
            # Failures are answered after the metrics and the log are written (below the
            # try), so a caller that sees the status also sees it counted.
            failure: errors.ServiceError | None = None
            run_token = RUN_ID.set(run_of(request)) if run_of is not None else None
            try:
                if authenticator is not None:
                    md = {k: v for k, v in (context.invocation_metadata() or ())}
                    principal = await authenticator.authenticate(md.get("authorization"))  # type: ignore[arg-type]
                    principal_id = principal.principal_id
                    token = set_principal(principal)
                return await inner(request, context)
            except errors.ServiceError as exc:
                failure = exc
            except grpc.aio.AbortError:
                code = context.code().name if context.code() else "ABORTED"  # type: ignore[union-attr]
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
            assert failure is not None  # the try either returned, raised, or set it
            await context.abort_with_status(failure.to_status())

        return handle
