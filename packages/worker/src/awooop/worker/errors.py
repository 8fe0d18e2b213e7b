"""Client-side view of awooop's rich errors (google.rpc ErrorInfo + BadRequest).

Every RPC error the SDK raises is an AwooopError carrying the status code, the ErrorInfo
reason (for example LEASE_LOST) and the field violations, so callers branch on `reason`
instead of parsing messages. LeaseLost is raised when this worker's lease is gone: stop
working on the run (the SDK does that for handlers)."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from awooop.common.v1 import errors_pb2


def reason(value: errors_pb2.ErrorReason.ValueType) -> str:
    """ErrorInfo.reason of an ErrorReason (protos/awooop/common/v1/errors.proto): its name
    without the prefix, as the services send it (ERROR_REASON_LEASE_LOST -> LEASE_LOST)."""
    return errors_pb2.ErrorReason.Name(value).removeprefix("ERROR_REASON_")


LEASE_LOST = reason(errors_pb2.ERROR_REASON_LEASE_LOST)
INVALID_TRANSITION = reason(errors_pb2.ERROR_REASON_INVALID_TRANSITION)
NOT_FOUND = reason(errors_pb2.ERROR_REASON_NOT_FOUND)
FORBIDDEN = reason(errors_pb2.ERROR_REASON_FORBIDDEN)
UNAUTHENTICATED = reason(errors_pb2.ERROR_REASON_UNAUTHENTICATED)
JOURNAL_TOO_LARGE = reason(errors_pb2.ERROR_REASON_JOURNAL_TOO_LARGE)
TOOL_FAILED = reason(errors_pb2.ERROR_REASON_TOOL_FAILED)


@dataclass(frozen=True)
class ErrorDetails:
    code: grpc.StatusCode
    reason: str
    message: str
    metadata: dict[str, str] = field(default_factory=dict)
    violations: list[tuple[str, str]] = field(default_factory=list)

    def render(self) -> str:
        """`<CODE> <REASON>: message` plus one indented line per field violation."""
        # a reason that repeats the code (NOT_FOUND, UNAUTHENTICATED, ...) is said once
        said = self.code.name if self.reason in ("", self.code.name) else f"{self.code.name} {self.reason}"
        head = f"{said}: {self.message}"
        # the server's message usually lists the violations already; repeat only what it left out
        extra = [f"  {f}: {d}" for f, d in self.violations if f"{f}: {d}" not in self.message]
        return "\n".join([head, *extra])


def details_of(err: grpc.RpcError) -> ErrorDetails:
    """Decodes a failed call's status; works for errors without rich details too."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = (err.details() if hasattr(err, "details") else "") or ""
    reason, metadata, violations = "", {}, []
    try:
        status = rpc_status.from_call(err)  # type: ignore[arg-type]
    except ValueError:  # status message and details disagree: keep the plain message
        status = None
    if status is not None:
        message = status.message or message
        for d in status.details:
            if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                d.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
            elif d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                br = error_details_pb2.BadRequest()
                d.Unpack(br)
                violations = [(v.field, v.description) for v in br.field_violations]
    return ErrorDetails(code, reason, message, metadata, violations)


class AwooopError(Exception):
    """A failed awooop RPC, decoded."""

    def __init__(self, details: ErrorDetails, method: str = "") -> None:
        super().__init__(details.render())
        self.details = details
        self.method = method

    @property
    def code(self) -> grpc.StatusCode:
        return self.details.code

    @property
    def reason(self) -> str:
        return self.details.reason

    @classmethod
    def from_rpc(cls, err: grpc.RpcError, method: str = "") -> AwooopError:
        d = details_of(err)
        kind = LeaseLost if d.reason == LEASE_LOST else cls
        return kind(d, method)


class LeaseLost(AwooopError):
    """The run's lease is no longer ours (reaped, cancelled, finished or handed to another worker)."""


class RunFinished(RuntimeError):
    """The handler used its RunContext after the run was completed, failed, or handed to an approver."""
