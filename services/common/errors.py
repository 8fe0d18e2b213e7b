"""The error model (docs/architecture.md, "Security and errors"): every non-OK status carries a
google.rpc.ErrorInfo (domain "awooop", UPPER_SNAKE reason, the seed's code in metadata)
and, for bad input, a google.rpc.BadRequest with field violations.

Logic code raises ServiceError; the server interceptor turns it into a rich status.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from awooop.common.v1 import errors_pb2

DOMAIN = "awooop"


def reason(value: errors_pb2.ErrorReason.ValueType) -> str:
    """ErrorInfo.reason of an ErrorReason: its name without the prefix (ERROR_REASON_LEASE_LOST -> LEASE_LOST)."""
    return errors_pb2.ErrorReason.Name(value).removeprefix("ERROR_REASON_")


# the reasons (declared in protos/awooop/common/v1/errors.proto; the README's error table lists them)
FIELD_INVALID = reason(errors_pb2.ERROR_REASON_FIELD_INVALID)
MALFORMED_REQUEST = reason(errors_pb2.ERROR_REASON_MALFORMED_REQUEST)
UNAUTHENTICATED = reason(errors_pb2.ERROR_REASON_UNAUTHENTICATED)
FORBIDDEN = reason(errors_pb2.ERROR_REASON_FORBIDDEN)
NOT_FOUND = reason(errors_pb2.ERROR_REASON_NOT_FOUND)
IDEMPOTENCY_CONFLICT = reason(errors_pb2.ERROR_REASON_IDEMPOTENCY_CONFLICT)
LEASE_LOST = reason(errors_pb2.ERROR_REASON_LEASE_LOST)
INVALID_TRANSITION = reason(errors_pb2.ERROR_REASON_INVALID_TRANSITION)
APPROVAL_EXPIRED = reason(errors_pb2.ERROR_REASON_APPROVAL_EXPIRED)
APPROVAL_INVALID = reason(errors_pb2.ERROR_REASON_APPROVAL_INVALID)
STORE_UNAVAILABLE = reason(errors_pb2.ERROR_REASON_STORE_UNAVAILABLE)
OVERLOADED = reason(errors_pb2.ERROR_REASON_OVERLOADED)
SHUTTING_DOWN = reason(errors_pb2.ERROR_REASON_SHUTTING_DOWN)
DEADLINE_EXCEEDED = reason(errors_pb2.ERROR_REASON_DEADLINE_EXCEEDED)
INTERNAL = reason(errors_pb2.ERROR_REASON_INTERNAL)
UNIMPLEMENTED = reason(errors_pb2.ERROR_REASON_UNIMPLEMENTED)
TOOL_FAILED = reason(errors_pb2.ERROR_REASON_TOOL_FAILED)
JOURNAL_TOO_LARGE = reason(errors_pb2.ERROR_REASON_JOURNAL_TOO_LARGE)
HISTORY_TOO_LARGE = reason(errors_pb2.ERROR_REASON_HISTORY_TOO_LARGE)
WAIT_CLOSED = reason(errors_pb2.ERROR_REASON_WAIT_CLOSED)
RUN_EVENTS_EXHAUSTED = reason(errors_pb2.ERROR_REASON_RUN_EVENTS_EXHAUSTED)
TOO_MANY_WATCHERS = reason(errors_pb2.ERROR_REASON_TOO_MANY_WATCHERS)
CHILD_LIMIT = reason(errors_pb2.ERROR_REASON_CHILD_LIMIT)


class ServiceError(Exception):
    """An expected failure with its gRPC status code and google.rpc details."""

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str,
        message: str,
        *,
        metadata: Mapping[str, str] | None = None,
        violations: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.metadata = dict(metadata or {})
        self.violations = list(violations or [])

    def to_status(self) -> grpc.Status:
        return rpc_status.to_status(self.to_rpc_status())

    def to_rpc_status(self) -> status_pb2.Status:
        info = error_details_pb2.ErrorInfo(reason=self.reason, domain=DOMAIN, metadata=self.metadata)
        details = [_pack(info)]
        if self.violations:
            br = error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=f, description=d) for f, d in self.violations
                ]
            )
            details.append(_pack(br))
        return status_pb2.Status(code=self.code.value[0], message=self.message, details=details)


def _pack(msg: object) -> any_pb2.Any:
    a = any_pb2.Any()
    a.Pack(msg)  # type: ignore[arg-type]
    return a


# --- constructors, one per row of the error table ---


def invalid(violations: list[tuple[str, str]], message: str | None = None) -> ServiceError:
    msg = message or "; ".join(f"{f}: {d}" for f, d in violations)
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, FIELD_INVALID, msg, violations=violations)


def malformed_request(method: str, detail: str) -> ServiceError:
    """The request bytes do not decode as the method's message (bad wire bytes, invalid UTF-8
    in a string field, nesting past the decoder's limit)."""
    return ServiceError(
        grpc.StatusCode.INVALID_ARGUMENT,
        MALFORMED_REQUEST,
        f"request is not a valid {method.rsplit('/', 1)[-1]} message: {detail}",
        metadata={"method": method},
    )


def unauthenticated(message: str = "missing or unknown API key") -> ServiceError:
    return ServiceError(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED, message)


def forbidden(message: str, **metadata: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.PERMISSION_DENIED, FORBIDDEN, message, metadata=metadata)


def not_found(what: str, ident: str, **context: str) -> ServiceError:
    # one metadata vocabulary for every reason: the id of a thing is `<thing>_id` (run_id, step_id)
    return ServiceError(
        grpc.StatusCode.NOT_FOUND, NOT_FOUND, f"{what} {ident} not found", metadata={f"{what}_id": ident, **context}
    )


def idempotency_conflict(message: str, **metadata: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.ALREADY_EXISTS, IDEMPOTENCY_CONFLICT, message, metadata=metadata)


def lease_lost(run_id: str, attempt: int) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        LEASE_LOST,
        f"lease ({run_id}, attempt {attempt}) is no longer held; stop working on this run",
        metadata={"run_id": run_id, "attempt": str(attempt)},
    )


def invalid_transition(run_id: str, status: str, action: str) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        INVALID_TRANSITION,
        f"cannot {action} run {run_id} in status {status}",
        metadata={"run_id": run_id, "status": status, "action": action},
    )


def approval_expired(run_id: str) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        APPROVAL_EXPIRED,
        f"approval token of run {run_id} expired",
        metadata={"run_id": run_id, "code": "E-APPROVAL-002"},
    )


def approval_invalid(run_id: str) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        APPROVAL_INVALID,
        f"approval token of run {run_id} is wrong or already used",
        metadata={"run_id": run_id},
    )


def wait_closed(wait_id: str, message: str, **metadata: str) -> ServiceError:
    """A durable wait that already has its outcome (metadata `outcome`) or whose run is over
    (metadata `status`): a second outcome is refused, naming the first."""
    return ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION, WAIT_CLOSED, message, metadata={"wait_id": wait_id, **metadata}
    )


def child_limit(message: str, **metadata: str) -> ServiceError:
    """StartChildRuns past the depth or fan-out limit (metadata `limit`, and `depth` or `children`)."""
    return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, CHILD_LIMIT, message, metadata=metadata)


def store_unavailable(detail: str) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.UNAVAILABLE, STORE_UNAVAILABLE, f"store unavailable: {detail}", metadata={"retry": "true"}
    )


def overloaded(limit: int) -> ServiceError:
    """More RPCs in flight on this server than AWOOOP_MAX_CONCURRENT_RPCS: refused before any
    work, retryable (the SDK retries UNAVAILABLE with backoff)."""
    return ServiceError(
        grpc.StatusCode.UNAVAILABLE,
        OVERLOADED,
        f"server overloaded: {limit} RPCs in flight (AWOOOP_MAX_CONCURRENT_RPCS); retry with backoff",
        metadata={"retry": "true", "limit": str(limit)},
    )


def shutting_down(message: str) -> ServiceError:
    """This replica is draining: the client's retry policy sends the call to another one."""
    return ServiceError(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN, message, metadata={"retry": "true"})


def deadline_exceeded(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_EXCEEDED, message)


def unimplemented(method: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.UNIMPLEMENTED, UNIMPLEMENTED, f"{method} is not implemented")


def internal(message: str = "internal error; this is a bug") -> ServiceError:
    return ServiceError(grpc.StatusCode.INTERNAL, INTERNAL, message)


# --- client side: decode a rich status (used by the SDK, the CLI and the tests) ---


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    if status is None:
        return None
    for d in status.details:
        if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            d.Unpack(info)
            return info
    return None


def bad_request(err: grpc.RpcError) -> error_details_pb2.BadRequest | None:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    if status is None:
        return None
    for d in status.details:
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            d.Unpack(br)
            return br
    return None
