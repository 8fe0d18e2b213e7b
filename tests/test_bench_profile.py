"""bench/profile.py names our own frames relative to the repository root of whatever checkout
runs it (not one particular checkout's absolute path)."""

from __future__ import annotations

from pathlib import Path

from bench.profile import summarize
from tests.harness.helpers import ROOT


def test_frames_are_named_relative_to_the_checkout_it_runs_in(tmp_path: Path) -> None:
    ours = ROOT / "services" / "scheduler" / "claiming.py"
    lib = ROOT / ".venv" / "lib" / "python3.11" / "site-packages" / "grpc" / "aio" / "_server.py"
    stacks = tmp_path / "scheduler-1.txt"
    stacks.write_text(f"serve ({lib}:10);claim ({ours}:42) 7\n")
    text = summarize(stacks)
    assert "claim (services/scheduler/claiming.py)" in text, text
    assert "serve (grpc/aio/_server.py)" in text, text
    assert str(ROOT) not in text
