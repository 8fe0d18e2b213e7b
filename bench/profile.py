"""Reads py-spy collapsed stacks (`run.py --profile DIR` writes one file per service process)
and prints where the time went: the functions with the most samples on the stack (inclusive)
and at its top (self). `python -m bench.profile DIR/ingest-1234.txt [--top 30] [--match services/]`."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]*)(?::(?P<line>\d+))?\)$")


def _short(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    for marker in ("site-packages/", "/work/main/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{m.group('func')} ({path})"


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
