"""Wires the reference tool gateway into the runtime."""

from __future__ import annotations

from awooop.tools.v1 import tools_pb2, tools_pb2_grpc
from services.common.runtime import AppContext, ServiceParts

SERVICE_NAME = tools_pb2.DESCRIPTOR.services_by_name["ToolGatewayService"].full_name


def build(ctx: AppContext) -> ServiceParts:
    return ServiceParts(
        servicers=[
            (tools_pb2_grpc.add_ToolGatewayServiceServicer_to_server, tools_pb2_grpc.ToolGatewayServiceServicer())
        ],
        service_names=[SERVICE_NAME],
        public=True,
    )
