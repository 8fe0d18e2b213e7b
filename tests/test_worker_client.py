"""The SDK's channels: UNAVAILABLE (and only UNAVAILABLE) is retried by the channel's service
config, every call has a deadline, and rich errors are decoded. Counted on the server side
(grpc_server_handled_total of the in-process servers)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from awooop.ingest.v1 import ingest_pb2
from awooop.tools.v1 import tools_pb2
from awooop.worker import AwooopError, Client, to_struct
from awooop.worker.client import address
from tests.harness.helpers import served, service_key

CREATE_RUN = "/awooop.ingest.v1.IngestService/CreateRun"
EXECUTE_TOOL = "/awooop.tools.v1.ToolGatewayService/ExecuteTool"


async def test_unavailable_is_retried_and_other_codes_are_not(start_services: Any) -> None:
    # a store that is down: every authenticated call answers UNAVAILABLE (STORE_UNAVAILABLE)
    rt = await start_services("ingest", database_url="postgresql://nobody@127.0.0.1:1/none", db_connect_timeout=1)
    gw = await start_services("gateway")  # a live one: its refusals are not UNAVAILABLE
    key = dict(await service_key(gw))["authorization"].removeprefix("Bearer ")
    client = Client(key=key, ingest=f"127.0.0.1:{rt.ports['ingest']}", gateway=f"127.0.0.1:{gw.ports['gateway']}")
    try:
        before = served(CREATE_RUN, "UNAVAILABLE")
        with pytest.raises(AwooopError) as err:
            await client.call(client.ingest.CreateRun, ingest_pb2.CreateRunRequest(project_id="p", idempotency_key="k"))
        assert err.value.code == grpc.StatusCode.UNAVAILABLE and err.value.reason == "STORE_UNAVAILABLE"
        assert served(CREATE_RUN, "UNAVAILABLE") - before == 4  # maxAttempts of the retry policy

        before = served(EXECUTE_TOOL, "INVALID_ARGUMENT")
        with pytest.raises(AwooopError) as err:
            await client.call(
                client.gateway.ExecuteTool,
                tools_pb2.ExecuteToolRequest(tool_id="no_such_tool", params=to_struct({}), project_id="p"),
            )
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.reason == "FIELD_INVALID"
        assert {f for f, _ in err.value.details.violations} >= {"tool_id", "idempotency_key"}
        assert served(EXECUTE_TOOL, "INVALID_ARGUMENT") - before == 1  # answered once, not retried
        assert "FIELD_INVALID" in str(err.value) and "tool_id" in str(err.value)
    finally:
        await client.close()


async def test_every_call_has_a_deadline(start_services: Any) -> None:
    rt = await start_services("gateway")
    key = dict(await service_key(rt))["authorization"].removeprefix("Bearer ")
    client = Client(key=key, gateway=f"127.0.0.1:{rt.ports['gateway']}", timeout=0.3)
    try:
        with pytest.raises(AwooopError) as err:
            await client.call(
                client.gateway.ExecuteTool,
                tools_pb2.ExecuteToolRequest(
                    tool_id="k8s_exec_pod",
                    params=to_struct({"pod": "p", "command": "true", "simulate_delay_ms": 1500}),
                    idempotency_key="slow",
                    project_id="p",
                ),
            )
        assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        await client.close()


def test_addresses_come_from_arguments_then_environment_then_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWOOOP_SAGA_ADDR", raising=False)
    assert address("saga") == "127.0.0.1:50053"
    monkeypatch.setenv("AWOOOP_SAGA_ADDR", "saga.internal:443")
    assert address("saga") == "saga.internal:443"
    assert address("saga", "10.0.0.5:50053") == "10.0.0.5:50053"
