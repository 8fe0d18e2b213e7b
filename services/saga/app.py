"""Wires the saga service into the runtime: the SagaService servicer, the compensation
driver's background loop (which also delivers escalation alerts), and their closers."""

from __future__ import annotations

from awooop.cli.health import PLANE_ALIASES
from awooop.saga.v1 import saga_pb2, saga_pb2_grpc
from services.common.runtime import AppContext, ServiceParts
from services.saga.driver import CompensationDriver
from services.saga.notifier import Notifier
from services.saga.servicer import SagaServicer

SERVICE_NAME = saga_pb2.DESCRIPTOR.services_by_name["SagaService"].full_name
# the compensation plane's health name (`awooop health ADDR --service compensation`)
COMPENSATION = PLANE_ALIASES["compensation"]


def build(ctx: AppContext) -> ServiceParts:
    notifier = Notifier(ctx)
    driver = CompensationDriver(ctx, notifier)
    return ServiceParts(
        servicers=[(saga_pb2_grpc.add_SagaServiceServicer_to_server, SagaServicer(ctx.settings, ctx.pool, driver))],
        service_names=[SERVICE_NAME],
        background=[driver.loop],
        on_stop=[driver.close, notifier.close],
        # NOT_SERVING while the gateway cannot be authenticated to; the journal stays SERVING
        planes={COMPENSATION: driver.auth.readiness},
    )
