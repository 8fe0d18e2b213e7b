"""ToolClient: calls a ToolGateway (awooop.tools.v1) with a step's idempotency key, so a step
retried after a crash does not run the tool twice.

    tools = ToolClient()   # AWOOOP_GATEWAY_ADDR or 127.0.0.1:50054
    result = await ctx.step("scale", tools.execute, tool_id="k8s_scale_deployment",
                            params={"deployment": "api", "replicas": 3})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from awooop.tools.v1 import tools_pb2
from awooop.worker.client import Client
from awooop.worker.run_scope import StepCall
from awooop.worker.structs import from_struct, to_struct


class ToolClient:
    def __init__(
        self, gateway: str | None = None, *, key: str | None = None, timeout: float = 30.0, client: Client | None = None
    ) -> None:
        self._own = client is None
        self.client = client or Client(gateway=gateway, key=key, timeout=timeout)
        self.timeout = timeout
        self.replayed: dict[str, bool] = {}  # idempotency key -> whether the gateway replayed it

    async def execute(self, call: StepCall) -> dict[str, Any]:
        """Step function: runs call.tool_id with call.params under call.idempotency_key."""
        return await self.call(
            call.tool_id,
            call.params,
            idempotency_key=call.idempotency_key,
            project_id=call.project_id,
            run_id=call.run_id,
            reason=f"step {call.step_id} (attempt {call.attempt})",
        )

    async def call(
        self,
        tool_id: str,
        params: Mapping[str, Any],
        *,
        idempotency_key: str,
        project_id: str,
        run_id: str = "",
        reason: str = "",
    ) -> dict[str, Any]:
        resp = await self.client.call(
            self.client.gateway.ExecuteTool,
            tools_pb2.ExecuteToolRequest(
                tool_id=tool_id,
                params=to_struct(dict(params)),
                idempotency_key=idempotency_key,
                project_id=project_id,
                run_id=run_id,
                reason=reason,
            ),
            timeout=self.timeout,
        )
        self.replayed[idempotency_key] = resp.replayed
        return from_struct(resp.result)

    async def close(self) -> None:
        if self._own:
            await self.client.close()
