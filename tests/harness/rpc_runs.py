"""Runs put into states through the services' own RPCs, as a worker or an operator would: the
console and CLI tests (tests/harness/console.py, tests/test_cli_runs.py) and bench/console.py."""

from __future__ import annotations

import os
from typing import Any

from google.protobuf import duration_pb2

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.saga.v1 import saga_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.tools.v1 import tools_pb2
from awooop.worker import Client, to_struct

SCALE = "k8s_scale_deployment"


async def ingest_run(client: Client, project: str, payload: dict[str, Any], event_id: str = "") -> str:
    """A new API-channel run (a random provider event id unless one is given); returns its id."""
    r = await client.call(
        client.ingest.IngestEvent,
        ingest_pb2.IngestEventRequest(
            project_id=project,
            channel_type=common_pb2.CHANNEL_TYPE_API,
            provider_event_id=event_id or os.urandom(8).hex(),
            payload=to_struct(payload),
        ),
    )
    return str(r.outcomes[0].run_id)


async def ingest_runs(client: Client, project: str, payloads: list[dict[str, Any]], **options: Any) -> list[str]:
    """New API-channel runs, one IngestEvents call (random provider event ids, the same run
    options for each, e.g. priority); returns their ids in order."""
    resp = await client.call(
        client.ingest.IngestEvents,
        ingest_pb2.IngestEventsRequest(
            events=[
                ingest_pb2.IngestEventRequest(
                    project_id=project,
                    channel_type=common_pb2.CHANNEL_TYPE_API,
                    provider_event_id=f"evt-{os.urandom(6).hex()}",
                    payload=to_struct(p),
                    **options,
                )
                for p in payloads
            ]
        ),
    )
    return [r.outcomes[0].run_id for r in resp.results]


async def claim_one(
    client: Client, worker_id: str, project: str, run_id: str = "", lease_ttl_s: int = 0
) -> common_pb2.LeaseToken:
    """Claims one run of the project (the oldest claimable one; checked to be run_id when given)."""
    resp = await client.call(
        client.scheduler.ClaimRuns,
        scheduler_pb2.ClaimRunsRequest(
            worker_id=worker_id,
            project_ids=[project],
            max_runs=1,
            lease_ttl=duration_pb2.Duration(seconds=lease_ttl_s) if lease_ttl_s else None,
        ),
    )
    if run_id:
        assert [c.run.run_id for c in resp.runs] == [run_id]
    return resp.runs[0].lease


async def scale_step(
    client: Client,
    lease: common_pb2.LeaseToken,
    step_id: str,
    params: dict[str, Any],
    result: dict[str, Any],
    undo: dict[str, Any] | None = None,
    reason: str = "",
) -> None:
    """A journaled, completed k8s_scale_deployment call (BeginStep, CompleteStep); undo: the params
    of the same tool that compensate it (none: the step has no compensation)."""
    await client.call(
        client.saga.BeginStep,
        saga_pb2.BeginStepRequest(
            lease=lease,
            step_id=step_id,
            step_type=common_pb2.STEP_TYPE_TOOL_CALL,
            tool_id=SCALE,
            tool_params=to_struct(params),
        ),
    )
    cmd = None
    if undo:
        cmd = common_pb2.CompensationCommand(tool_id=SCALE, params=to_struct(undo), reason=reason)
    await client.call(
        client.saga.CompleteStep,
        saga_pb2.CompleteStepRequest(lease=lease, step_id=step_id, result=to_struct(result), compensation_cmd=cmd),
    )


async def request_approval(client: Client, lease: common_pb2.LeaseToken, summary: str) -> str:
    """The run asks for approval; returns the approval token."""
    resp = await client.call(
        client.scheduler.RequestApproval, scheduler_pb2.RequestApprovalRequest(lease=lease, summary=summary)
    )
    return str(resp.approval_token)


async def create_deployment(client: Client, project: str, replicas: int, name: str = "api") -> None:
    """A deployment in the reference gateway (k8s_create_resource), for steps to scale and
    compensations to scale back; client needs a gateway address."""
    await client.call(
        client.gateway.ExecuteTool,
        tools_pb2.ExecuteToolRequest(
            tool_id="k8s_create_resource",
            params=to_struct({"kind": "Deployment", "name": name, "spec": {"replicas": replicas}}),
            idempotency_key="setup",
            project_id=project,
        ),
    )
