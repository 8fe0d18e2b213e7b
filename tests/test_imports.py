"""Imports point one way ([tool.importlinter] in pyproject.toml): no import cycle in the server
package (services) or the client package (awooop), the client never imports the server, and
services.common imports no service. lint-imports reads the real import graph of both trees."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.harness.helpers import ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def test_the_import_contracts_are_kept() -> None:
    # --no-cache: a cache left by an older tree must not answer for this one
    out = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout, out.stdout
