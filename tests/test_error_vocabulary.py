"""One error vocabulary: ErrorInfo metadata names a thing's id `<thing>_id` in every reason
(NOT_FOUND as LEASE_LOST), so a client in any language reads `run_id` the same way everywhere."""

from __future__ import annotations

import uuid
from typing import Any

import grpc

from awooop.saga.v1 import saga_pb2
from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common import errors
from tests.harness.helpers import expect_error
from tests.harness.saga import PROJECT, claim, lease, new_run, saga_stub


async def test_not_found_and_lease_lost_name_the_run_run_id(
    start_services: Any, channels: Any, make_key: Any, db: Any
) -> None:
    md = await make_key("vocab", {PROJECT: ["worker", "admin"]})
    rt = await start_services("scheduler")
    scheduler = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    missing = str(uuid.uuid4())
    err = await expect_error(
        scheduler.GetRun(scheduler_pb2.GetRunRequest(run_id=missing), metadata=md), grpc.StatusCode.NOT_FOUND
    )
    assert errors.error_info(err).metadata == {"run_id": missing}  # type: ignore[union-attr]
    # the message says it once: no "NOT_FOUND NOT_FOUND:" style repetition from the server either
    assert err.details() == f"run {missing} not found"

    saga = await saga_stub(start_services, channels)
    run_id = await new_run(db)
    attempt = await claim(db, run_id)
    err = await expect_error(
        saga.CompleteStep(saga_pb2.CompleteStepRequest(lease=lease(run_id, attempt), step_id="nope"), metadata=md),
        grpc.StatusCode.NOT_FOUND,
    )
    assert errors.error_info(err).metadata == {"step_id": "nope", "run_id": run_id}  # type: ignore[union-attr]

    stale: Any = lease(run_id, attempt + 1)
    err = await expect_error(
        saga.CompleteStep(saga_pb2.CompleteStepRequest(lease=stale, step_id="nope"), metadata=md),
        grpc.StatusCode.FAILED_PRECONDITION,
        errors.LEASE_LOST,
    )
    assert errors.error_info(err).metadata["run_id"] == run_id  # type: ignore[union-attr]
