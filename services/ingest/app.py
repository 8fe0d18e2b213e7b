"""Wires the ingest service into the runtime."""

from __future__ import annotations

from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from services.common.runtime import AppContext, ServiceParts

SERVICE_NAME = ingest_pb2.DESCRIPTOR.services_by_name["IngestService"].full_name


def build(ctx: AppContext) -> ServiceParts:
    # RPCs come with the ingest issue; until then the generated base answers UNIMPLEMENTED.
    return ServiceParts(
        servicers=[(ingest_pb2_grpc.add_IngestServiceServicer_to_server, ingest_pb2_grpc.IngestServiceServicer())],
        service_names=[SERVICE_NAME],
    )
