"""Builds packages/worker-ts (the TypeScript worker package) for the tests that run it as real
node processes: `npm ci` from its committed package-lock.json, codegen from protos/ (ts-proto
through buf), `tsc`, and the package's test worker. Built once per test session, under a file
lock (two pytest processes on one checkout must not run `npm ci` in one directory at once)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness.helpers import ROOT

PACKAGE = ROOT / "packages" / "worker-ts"
NPM_QUIET = ["--no-audit", "--no-fund", "--loglevel=error"]
_built: list[Path] = []


def need(program: str) -> str:
    """The program's path; a failure in CI (.ci/install-debian installs Node), else a skip."""
    found = shutil.which(program)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{program} is not installed")
        pytest.skip(f"{program} is not installed")
    return found


def npm(*args: str, cwd: Path, timeout: float = 600) -> None:
    out = subprocess.run([need("npm"), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"npm {' '.join(args)} in {cwd}:\n{out.stdout}\n{out.stderr}"


def build_package() -> Path:
    """packages/worker-ts built (dist/ and test/dist/); its directory."""
    if _built:
        return _built[0]
    need("node")
    with open(PACKAGE / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        npm("ci", *NPM_QUIET, cwd=PACKAGE)
        npm("run", "build", cwd=PACKAGE)  # buf generate (ts-proto) + tsc
        npm("run", "build:test", cwd=PACKAGE)
    _built.append(PACKAGE)
    return PACKAGE
