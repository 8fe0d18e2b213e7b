"""Reads py-spy collapsed stacks (`run.py --profile DIR` writes one file per service process)
and prints where the time went: the functions with the most samples on the stack (inclusive)
and at its top (self). `python -m bench.profile DIR/ingest-1234.txt [--top 30] [--match services/]`."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]*)(?::(?P<line>\d+))?\)$")
# this checkout's root, found at run time: frames of our own code print relative to it
ROOT = Path(__file__).resolve().parent.parent


def _short(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    return f"{m.group('func')} ({_relative(m.group('file'))})"


def _relative(path: str) -> str:
    """A frame's file relative to site-packages (a venv may sit inside the checkout), else to the
    repository root, else to the stdlib."""
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1]
    if path.startswith(f"{ROOT}/"):
        return path.removeprefix(f"{ROOT}/")
    if "lib/python3" in path:
        return path.split("lib/python3", 1)[1]
    return path


def summarize(path: Path, top: int = 25, match: str = "") -> str:
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_short(f) for f in stack.split(";") if f]
        for f in set(frames):
            inclusive[f] += n
        if frames:
            own[frames[-1]] += n
    if total == 0:
        return f"{path}: no samples"
    out = [f"{path.name}: {total} samples"]
    for title, counter in (("inclusive", inclusive), ("self", own)):
        out.append(f"-- top {top} by {title} share --")
        shown = 0
        for f, n in counter.most_common():
            if match and match not in f:
                continue
            out.append(f"{100 * n / total:6.1f}%  {f}")
            shown += 1
            if shown >= top:
                break
    return "\n".join(out)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--match", default="", help="only functions whose name or file contains this")
    a = p.parse_args()
    for f in a.files:
        print(summarize(f, a.top, a.match))
