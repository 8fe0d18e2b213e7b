"""No hand-written function or method in the server (services/) or the client package
(packages/*/src, and sdk/ where it still exists) is longer than 60 lines, unless its docstring
says why in a sentence that starts "Long because" (e.g. "Long because it is one linear
protocol: ..."); `grep -rn "Long because"` lists every exception.

A function's length is its def's whole span (decorators aside): from the `def` line to its last
line, docstring, comments and nested functions included. Generated files (a header saying they
are generated and not to be edited: the protobuf stubs, scripts/gen-statements' *_sql.py) are
not read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOT_GLOBS = ("services", "sdk", "packages/*/src")
MAX_LINES = 60
REASON = re.compile(r"\bLong because\b")
GENERATED = re.compile(r"\bgenerated\b.{0,200}\bdo not edit\b", re.IGNORECASE | re.DOTALL)


def _sources() -> list[Path]:
    roots = [p for pattern in ROOT_GLOBS for p in REPO.glob(pattern) if p.is_dir()]
    files = sorted({f for root in roots for f in root.rglob("*.py")})
    return [f for f in files if not GENERATED.search(f.read_text(encoding="utf-8")[:400])]


def long_without_reason(source: str, name: str) -> list[str]:
    """The functions of one module over MAX_LINES whose docstring gives no "Long because" reason."""
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES and not REASON.search(ast.get_docstring(node) or ""):
                found.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_over_60_lines_without_a_reason() -> None:
    sources = _sources()
    assert any(f.parts[-3:] == ("services", "scheduler", "servicer.py") for f in sources), "roots not found"
    found = [x for f in sources for x in long_without_reason(f.read_text(encoding="utf-8"), str(f.relative_to(REPO)))]
    assert found == [], (
        "split these, or say why in their docstring (a sentence starting 'Long because'):\n" + "\n".join(found)
    )


def _function(body_lines: int, docstring: str) -> str:
    body = "".join(f"    x{i} = {i}\n" for i in range(body_lines))
    return f'def f() -> None:\n    """{docstring}"""\n{body}'


def test_the_check_counts_the_whole_def_and_reads_the_reason() -> None:
    # 1 def line + 1 docstring line + 58 = 60 lines: allowed; one more is not, unless it says why
    assert long_without_reason(_function(58, "Short."), "m.py") == []
    assert long_without_reason(_function(59, "Short."), "m.py") == ["m.py:1 f (61 lines)"]
    assert long_without_reason(_function(59, "Does f. Long because it is one linear protocol."), "m.py") == []
    nested = "class C:\n    async def g(self) -> None:\n" + "".join(f"        y{i} = {i}\n" for i in range(60))
    assert long_without_reason(nested, "m.py") == ["m.py:2 g (61 lines)"]
