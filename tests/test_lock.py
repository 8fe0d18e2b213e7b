"""The reproducible build (docs/dependencies.md): uv.lock matches both pyproject.toml files, the
packages' floors admit no runtime older than the one the contracts were generated for, and every npm install
is `npm ci` from a committed package-lock.json that pins the TypeScript generators."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

from tests.harness.helpers import ROOT
from tests.harness.lock import uv

PYPROJECTS = [ROOT / "pyproject.toml", ROOT / "packages" / "worker" / "pyproject.toml"]


def locked() -> dict[str, str]:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    return {p["name"]: p["version"] for p in lock["package"] if "version" in p}


def test_the_lock_matches_both_pyprojects_and_pins_the_generators() -> None:
    checked = subprocess.run([uv(), "lock", "--check", "--offline"], capture_output=True, text=True, cwd=ROOT)
    assert checked.returncode == 0, checked.stderr
    pins = locked()
    for tool in ("grpcio-tools", "mypy-protobuf", "buf-bin", "ruff", "mypy", "pytest", "protobuf"):
        assert tool in pins, f"{tool} is not in uv.lock"
    # uv itself: the version ./dev installs is the one pyproject requires
    required = tomllib.loads(PYPROJECTS[0].read_text())["tool"]["uv"]["required-version"]
    assert required == "==" + re.search(r"^uv==(\S+)", (ROOT / "scripts" / "uv-requirements.txt").read_text(), re.M)[1]


def floor(requirement: str) -> tuple[int, ...]:
    found = re.search(r">=([\d.]+)", requirement)
    assert found, f"{requirement} has no floor"
    return tuple(int(x) for x in found[1].split("."))


def test_the_packages_floors_admit_no_runtime_older_than_the_generated_code() -> None:
    """An install beside an older grpcio or protobuf than the generator's fails at import time."""
    generated = ROOT / "packages" / "worker" / "src" / "awooop" / "common" / "v1"
    grpc_stub = (generated / "common_pb2_grpc.py").read_text()
    grpc_generated = tuple(int(x) for x in re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", grpc_stub)[1].split("."))
    message = (generated / "common_pb2.py").read_text()
    major, minor, patch = re.search(r"Domain.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", message).groups()
    proto_generated = (int(major), int(minor), int(patch))
    for path in PYPROJECTS:
        deps = tomllib.loads(path.read_text())["project"]["dependencies"]
        by_name = {re.match(r"[A-Za-z0-9_.-]+", d)[0]: d for d in deps}
        assert floor(by_name["grpcio"]) >= grpc_generated, (path, by_name["grpcio"], grpc_generated)
        assert floor(by_name["protobuf"]) >= proto_generated, (path, by_name["protobuf"], proto_generated)
    pins = locked()
    generator = tuple(int(x) for x in pins["grpcio-tools"].split("."))
    assert generator == grpc_generated, "the contracts were not made by the locked grpcio-tools: run scripts/gen-protos"


def test_npm_installs_are_clean_installs_of_committed_locks() -> None:
    for package in ("packages/worker-ts", "examples/node-worker"):
        lock = json.loads((ROOT / package / "package-lock.json").read_text())
        assert lock["lockfileVersion"] >= 2
        for dep, entry in lock["packages"].items():
            if dep.startswith("node_modules/") and not entry.get("link"):
                assert entry.get("integrity") and entry.get("version"), f"{package}: {dep} is not pinned"
    generators = json.loads((ROOT / "packages" / "worker-ts" / "package-lock.json").read_text())["packages"]
    assert {"node_modules/@bufbuild/buf", "node_modules/ts-proto"} <= set(generators)
    # every npm the tests and docs run installs from the lock: `npm ci`, never `npm install`
    texts = [*ROOT.glob("tests/**/*.py"), *ROOT.glob("**/README.md"), *ROOT.glob("docs/*.md"), ROOT / ".ci" / "run"]
    for path in texts:
        if "node_modules" in path.parts or ".venv" in path.parts or path == Path(__file__):
            continue
        assert not re.search(r"npm (install|i)\b", path.read_text()), f"{path} runs npm install; use npm ci"
