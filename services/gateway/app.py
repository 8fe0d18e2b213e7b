"""Wires the reference tool gateway into the runtime (API keys as at every service; it binds to
AWOOOP_HOST:AWOOOP_GATEWAY_PORT and keeps its state in the shared store's awooop_refgw_* tables)."""

from __future__ import annotations

from awooop.tools.v1 import tools_pb2, tools_pb2_grpc
from services.common.runtime import AppContext, ServiceParts
from services.gateway.servicer import GatewayServicer

SERVICE_NAME = tools_pb2.DESCRIPTOR.services_by_name["ToolGatewayService"].full_name


def build(ctx: AppContext) -> ServiceParts:
    servicer = GatewayServicer(ctx.pool, ctx.settings.max_payload_bytes)
    return ServiceParts(
        servicers=[(tools_pb2_grpc.add_ToolGatewayServiceServicer_to_server, servicer)],
        service_names=[SERVICE_NAME],
        on_stop=[servicer.close],
    )
