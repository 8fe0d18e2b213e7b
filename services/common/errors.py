"""The error model (ARCHITECTURE.md section 8): every non-OK status carries a
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

DOMAIN = "awooop"

# reason constants (the error table in the README lists them all)
FIELD_INVALID = "FIELD_INVALID"
UNAUTHENTICATED = "UNAUTHENTICATED"
FORBIDDEN = "FORBIDDEN"
NOT_FOUND = "NOT_FOUND"
IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
LEASE_LOST = "LEASE_LOST"
INVALID_TRANSITION = "INVALID_TRANSITION"
APPROVAL_EXPIRED = "APPROVAL_EXPIRED"
APPROVAL_INVALID = "APPROVAL_INVALID"
STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
INTERNAL = "INTERNAL"
UNIMPLEMENTED = "UNIMPLEMENTED"


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


def store_unavailable(detail: str) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.UNAVAILABLE, STORE_UNAVAILABLE, f"store unavailable: {detail}", metadata={"retry": "true"}
    )


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
