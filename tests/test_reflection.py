"""Protos usable from any language: `buf build` of protos/ alone resolves google/rpc; every service
serves reflection v1 and v1alpha with the proto comments (grpcurl describe, a Python v1 client)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2 as alpha_pb2

from services.common import reflection

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SERVICES = {
    "ingest": "awooop.ingest.v1.IngestService",
    "scheduler": "awooop.scheduler.v1.SchedulerService",
    "saga": "awooop.saga.v1.SagaService",
    "gateway": "awooop.tools.v1.ToolGatewayService",
}


def _tool(name: str) -> str:
    return shutil.which(name) or str(BIN / name)


def test_buf_build_of_protos_alone_resolves_google_rpc(tmp_path: Path) -> None:
    image = tmp_path / "image.binpb"
    out = subprocess.run(
        [_tool("buf"), "build", "-o", str(image)], cwd=ROOT / "protos", capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    names = {f.name for f in descriptor_pb2.FileDescriptorSet.FromString(image.read_bytes()).file}
    assert {"google/rpc/status.proto", "google/rpc/error_details.proto"} <= names
    assert "Apache License" in (ROOT / "protos/google/LICENSE").read_text()
    # Python keeps googleapis-common-protos' google.rpc modules: nothing generated for them
    assert not (ROOT / "packages/worker/src/google").exists()


async def _v1_call(port: int, req: alpha_pb2.ServerReflectionRequest) -> alpha_pb2.ServerReflectionResponse:
    """A reflection v1 client: the v1 method path with the (wire-identical) v1alpha messages."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=alpha_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=alpha_pb2.ServerReflectionResponse.FromString,
        )
        stream = call(iter([req]))
        async for resp in stream:
            return resp
    raise AssertionError("no reflection answer")


async def test_reflection_v1_lists_services_and_serves_comments(start_services: Any) -> None:
    rt = await start_services("ingest", "scheduler", "saga", "gateway")
    for name, service in SERVICES.items():
        listed = await _v1_call(rt.ports[name], alpha_pb2.ServerReflectionRequest(list_services=""))
        names = {s.name for s in listed.list_services_response.service}
        assert {service, reflection.V1, reflection.V1ALPHA, "grpc.health.v1.Health"} <= names, names

    got = await _v1_call(
        rt.ports["scheduler"],
        alpha_pb2.ServerReflectionRequest(file_containing_symbol=SERVICES["scheduler"]),
    )
    served = got.file_descriptor_response.file_descriptor_proto
    files = [descriptor_pb2.FileDescriptorProto.FromString(b) for b in served]
    assert files[0].name == "awooop/scheduler/v1/scheduler.proto"
    assert files[0].source_code_info.location, "descriptors served without source info"
    comments = " ".join(loc.leading_comments for loc in files[0].source_code_info.location)
    assert "owns the run state machine" in comments
    # imports come along, so a client can resolve every type
    assert {"awooop/common/v1/common.proto", "google/protobuf/struct.proto"} <= {f.name for f in files}

    missing = await _v1_call(rt.ports["ingest"], alpha_pb2.ServerReflectionRequest(file_containing_symbol="no.Such"))
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


async def _grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [_tool("grpcurl"), "-plaintext", *args], capture_output=True, text=True, timeout=60
    )


async def test_grpcurl_describe_prints_the_proto_comments_on_every_service(start_services: Any) -> None:
    rt = await start_services("ingest", "scheduler", "saga", "gateway")
    for name, service in SERVICES.items():
        out = await _grpcurl(f"127.0.0.1:{rt.ports[name]}", "describe", service)
        assert out.returncode == 0, out.stderr
        assert "//" in out.stdout, f"{name}: describe shows no comments:\n{out.stdout}"
    # a field's comment, from a message of the scheduler contract
    out = await _grpcurl(f"127.0.0.1:{rt.ports['scheduler']}", "describe", "awooop.scheduler.v1.HeartbeatRequest")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("//") >= 2, out.stdout
    # grpcurl asks v1 first and falls back to v1alpha; both answer
    for service in (reflection.V1, reflection.V1ALPHA):
        out = await _grpcurl(f"127.0.0.1:{rt.ports['ingest']}", "describe", service)
        assert out.returncode == 0 and "ServerReflectionInfo" in out.stdout, out.stderr


async def test_buf_curl_with_reflection_v1_lists_and_calls(start_services: Any) -> None:
    """`buf curl --reflect-protocol grpc-v1` (no fallback to v1alpha): lists the services and
    calls an RPC, with the request built from the served descriptors."""
    rt = await start_services("ingest")
    base = ["--protocol", "grpc", "--http2-prior-knowledge", "--reflect-protocol", "grpc-v1"]
    url = f"http://127.0.0.1:{rt.ports['ingest']}"
    out = await asyncio.to_thread(
        subprocess.run, [_tool("buf"), "curl", *base, "--list-methods", url], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert f"{SERVICES['ingest']}/IngestEvent" in out.stdout.split()
    # a call without a key: the request JSON is encoded by reflection, the answer is the server's refusal
    out = await asyncio.to_thread(
        subprocess.run,
        [_tool("buf"), "curl", *base, "-d", '{"project_id":"p"}', f"{url}/{SERVICES['ingest']}/CreateRun"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "unauthenticated" in out.stderr.lower(), out.stderr
