"""Shared pieces of the deployment tests (store failures, PgBouncer, failover, replicas):
keys on a database other than the fixture's, request builders, and a tally of answers."""

from __future__ import annotations

import collections
import os
import shutil
from dataclasses import dataclass, field

import asyncpg
import grpc
import pytest
from google.protobuf import struct_pb2

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from services.common import principals
from tests.harness.helpers import reason_of

Metadata = tuple[tuple[str, str], ...]


def find_program(name: str, *candidates: str) -> str | None:
    """The path of an installed program: `name` on PATH, else the first of `candidates` (names or
    absolute paths, such as Debian's /usr/sbin programs) that is there."""
    for c in (name, *candidates):
        path = shutil.which(c) or (c if os.path.isabs(c) and os.access(c, os.X_OK) else None)
        if path:
            return path
    return None


def require_program(name: str, *candidates: str) -> str:
    """The path of an installed program; skips locally when missing, FAILS in CI (where the
    .ci/install-* script must have installed it)."""
    path = find_program(name, *candidates)
    if path:
        return path
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{name} is not installed (the .ci/install script should have installed it)")
    pytest.skip(f"{name} is not installed")


async def key_on(dsn: str, principal_id: str, roles: dict[str, list[str]]) -> Metadata:
    conn = await asyncpg.connect(dsn)
    try:
        await principals.create_principal(conn, principal_id, "user")
        for project, names in roles.items():
            for role in names:
                await principals.grant_role(conn, principal_id, project, role)
        issued = await principals.issue_key(conn, principal_id)
    finally:
        await conn.close()
    return (("authorization", f"Bearer {issued.key}"),)


def tg_event(project: str, update_id: int) -> ingest_pb2.IngestEventRequest:
    payload = struct_pb2.Struct()
    payload.update({"update_id": update_id, "message": {"text": f"hello {update_id}"}})
    return ingest_pb2.IngestEventRequest(
        project_id=project, channel_type=common_pb2.CHANNEL_TYPE_TELEGRAM, payload=payload
    )


@dataclass
class Tally:
    """Answers by status code (and reason for failures)."""

    codes: collections.Counter[str] = field(default_factory=collections.Counter)
    reasons: collections.Counter[str] = field(default_factory=collections.Counter)

    def ok(self) -> None:
        self.codes["OK"] += 1

    def failed(self, err: grpc.aio.AioRpcError) -> None:
        self.codes[err.code().name] += 1
        self.reasons[f"{err.code().name}/{reason_of(err)}"] += 1

    def unexpected(self) -> dict[str, int]:
        """Failures that are not the retryable store answer."""
        return {k: v for k, v in self.reasons.items() if k != "UNAVAILABLE/STORE_UNAVAILABLE"}
