"""Wires the saga service into the runtime."""

from __future__ import annotations

from awooop.saga.v1 import saga_pb2, saga_pb2_grpc
from services.common.runtime import AppContext, ServiceParts

SERVICE_NAME = saga_pb2.DESCRIPTOR.services_by_name["SagaService"].full_name


def build(ctx: AppContext) -> ServiceParts:
    return ServiceParts(
        servicers=[(saga_pb2_grpc.add_SagaServiceServicer_to_server, saga_pb2_grpc.SagaServiceServicer())],
        service_names=[SERVICE_NAME],
    )
