"""What a step function receives (StepCall), and what the durable-wait and child-run helpers
(waits.py, children.py) use of a running run (RunScope). RunContext (context.py) is a RunScope;
the helpers depend on this module rather than on context.py, which imports them: imports point
one way (docs/architecture.md)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2
from awooop.worker.client import Client

Json = dict[str, Any]


@dataclass(frozen=True)
class StepCall:
    """What a step function receives. Pass idempotency_key to the tool: it is the same on every attempt."""

    run_id: str
    project_id: str
    step_id: str
    idempotency_key: str
    tool_id: str
    params: Json
    attempt: int
    retry: bool  # an earlier attempt began this step and did not record its end


class RunScope(Protocol):
    """A claimed run as the wait and child helpers use it: its client and lease, this attempt's
    step actions and outcome, its log, and the journal calls of RunContext."""

    client: Client
    tracer: Any  # OpenTelemetry tracer (None: off)
    lease: common_pb2.LeaseToken
    actions: dict[str, str]
    outcome: str | None
    log: logging.LoggerAdapter[logging.Logger]

    async def _known(self, step_id: str) -> common_pb2.SagaStep | None: ...

    async def _reach(
        self,
        step_id: str,
        kind: int,
        tool_id: str = "",
        params: Mapping[str, Any] | None = None,
        *,
        ordered: bool = True,
    ) -> None: ...

    async def _record(self, request: saga_pb2.RecordStepRequest) -> saga_pb2.RecordStepResponse | None: ...

    def _ending(self, outcome: str) -> AbstractAsyncContextManager[None]: ...
