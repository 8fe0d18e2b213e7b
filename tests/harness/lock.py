"""The lock (uv.lock) for tests that build an environment of their own: the pinned uv that ./dev
installs (scripts/uv-requirements.txt) and the hash-pinned requirements it exports for a package."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.harness.helpers import ROOT

UV_REQUIREMENTS = ROOT / "scripts" / "uv-requirements.txt"


def uv() -> str:
    """The uv that ./dev installed into .tools/ (the tests run under ./dev, which installs it first)."""
    version = re.search(r"^uv==(\S+)", UV_REQUIREMENTS.read_text(), re.M)
    assert version, f"{UV_REQUIREMENTS} pins no uv"
    path = ROOT / ".tools" / f"uv-{version.group(1)}" / "bin" / "uv"
    assert path.exists(), f"{path} missing: run the tests with ./dev test, which installs it"
    return str(path)


def locked_requirements(package: str, out: Path) -> Path:
    """package's runtime requirements as uv.lock pins them, with hashes, as a requirements file."""
    exported = subprocess.run(
        [uv(), "export", "--frozen", "--package", package, "--no-emit-workspace", "--no-dev", "--no-header",
         "-q", "-o", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    return out
