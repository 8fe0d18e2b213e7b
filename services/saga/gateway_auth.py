"""Whether the saga can authenticate to the tool gateway, and saying so when it cannot.

Every compensation is a ToolGateway call made with AWOOOP_INTERNAL_API_KEY. Without a key the
gateway accepts, every compensation would end compensation_failed (UNAUTHENTICATED) one by one.
So while the key is missing or refused the compensation plane's health (`awooop.saga.compensation`)
is NOT_SERVING, one ERROR line says what to set, the awooop_saga_gateway_key_refused gauge is 1
(alert AwooopSagaKeyRefused), and the driver claims no compensation request: they wait, recorded,
until the key works. The journal (SagaService, the whole server "") stays SERVING: workers'
steps of every project go on (a whole-server NOT_SERVING made every SDK's health-checked channel
refuse BeginStep and RecordStep).

The check: an empty ExecuteTool request. A gateway authenticates a call before it reads it
(the reference gateway, like every awooop service, in its interceptor), and an empty request
names no tool, key or project, so nothing runs: UNAUTHENTICATED means the key is refused, any
other answer (INVALID_ARGUMENT) that it got through. No answer (gateway unreachable) decides
nothing: compensations go ahead and fail or succeed on their own, as before. (The health service
cannot tell: it is public, so it never looks at a key.) The probe is quiet: it runs until the key
is accepted once, and an awooop gateway logs it, like every call, only in its access log at DEBUG.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import Enum

import grpc

from awooop.tools.v1 import tools_pb2, tools_pb2_grpc
from services.common.health import Readiness
from services.common.settings import Settings
from services.saga.metrics import GATEWAY_AUTH_PROBES, GATEWAY_KEY_REFUSED

log = logging.getLogger("awooop.saga.gateway_auth")

# what to do about it, in every message that reports a refused or missing key
HOW = (
    "set AWOOOP_INTERNAL_API_KEY (or AWOOOP_INTERNAL_API_KEY_FILE) to the key of a service principal with a role "
    "in every project: awooop admin ensure-service-key (docs/operations.md, The internal service key)"
)
PROBE_TIMEOUT = 5.0  # at most; AWOOOP_TOOL_TIMEOUT when shorter
# answers that say nothing about the key: the gateway is not there (yet)
NO_VERDICT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


class Verdict(Enum):
    ACCEPTED = "accepted"
    REFUSED = "refused"
    UNKNOWN = "unknown"


def missing_key(gateway_addr: str) -> str:
    return (
        f"compensation is stopped: AWOOOP_INTERNAL_API_KEY is not set, so the tool gateway at {gateway_addr} "
        f"would refuse every compensation call; {HOW}"
    )


def refused_key(gateway_addr: str, detail: str) -> str:
    return (
        f"compensation is stopped: the tool gateway at {gateway_addr} refuses AWOOOP_INTERNAL_API_KEY "
        f"(UNAUTHENTICATED: {detail}); {HOW}"
    )


class GatewayAuth:
    """The saga's standing with the gateway, reported through its compensation plane's health."""

    def __init__(
        self,
        settings: Settings,
        stub: Callable[[], tools_pb2_grpc.ToolGatewayServiceAsyncStub],
        metadata: tuple[tuple[str, str], ...],
    ) -> None:
        self.addr = settings.gateway_addr
        self._timeout = min(settings.tool_timeout, PROBE_TIMEOUT)
        self._stub = stub
        self._metadata = metadata
        self._verdict = Verdict.UNKNOWN
        problem = None if metadata else missing_key(self.addr)
        self.readiness = Readiness(problem)
        GATEWAY_KEY_REFUSED.set(0 if problem is None else 1)
        if problem is not None:
            log.error(problem)

    async def usable(self) -> bool:
        """May the driver claim compensation requests now? Asks the gateway until it has accepted
        the key once (and again after a refusal)."""
        if not self._metadata:
            return False
        if self._verdict is not Verdict.ACCEPTED:
            self._verdict = await self._probe()
        return self._verdict is not Verdict.REFUSED

    async def refused(self, detail: str) -> None:
        """A call with the key was answered UNAUTHENTICATED (the key was revoked, or never worked)."""
        self._verdict = Verdict.REFUSED
        GATEWAY_KEY_REFUSED.set(1)
        problem = refused_key(self.addr, detail)
        if await self.readiness.set(problem):
            log.error(problem)

    async def _probe(self) -> Verdict:
        try:
            await self._stub().ExecuteTool(
                tools_pb2.ExecuteToolRequest(), timeout=self._timeout, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in NO_VERDICT:
                GATEWAY_AUTH_PROBES.labels("no_answer").inc()
                return Verdict.UNKNOWN
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                GATEWAY_AUTH_PROBES.labels("refused").inc()
                await self.refused(exc.details() or "")
                return Verdict.REFUSED
        GATEWAY_AUTH_PROBES.labels("accepted").inc()
        GATEWAY_KEY_REFUSED.set(0)
        await self.readiness.set(None)
        # once per acceptance: probes run only until the key is accepted (or after a refusal)
        log.info("the tool gateway at %s accepts AWOOOP_INTERNAL_API_KEY: compensation runs", self.addr)
        return Verdict.ACCEPTED
