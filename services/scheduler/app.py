"""Wires the scheduler service into the runtime."""

from __future__ import annotations

from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common.runtime import AppContext, ServiceParts

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name


def build(ctx: AppContext) -> ServiceParts:
    return ServiceParts(
        servicers=[
            (scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server, scheduler_pb2_grpc.SchedulerServiceServicer())
        ],
        service_names=[SERVICE_NAME],
    )
