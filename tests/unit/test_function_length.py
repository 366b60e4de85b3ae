"""No function or method of the product is over 60 lines (issue 31).

Counted from its `def` (decorators aside) to its last line, docstring and comments included: a
function that long does several things, and a reader must hold all of them to change one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("slurmgate", "binder", "webhook", "certs")
MAX_LINES = 60


def long_functions(source: str, filename: str = "<string>") -> list[str]:
    """`file:line name (N lines)` for each function or method in `source` over MAX_LINES,
    nested ones included."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None  # always set by ast.parse
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
                found.append(f"{filename}:{node.lineno} {node.name} ({lines} lines)")
    return found


def _python_files() -> list[Path]:
    return [path for top in SCANNED for path in sorted((ROOT / top).rglob("*.py"))]


def test_no_function_is_over_60_lines() -> None:
    files = _python_files()
    assert len(files) > 20  # the scan sees the product, not an empty folder
    offenders = [hit for path in files
                 for hit in long_functions(path.read_text(), str(path.relative_to(ROOT)))]
    assert not offenders, "split these into smaller functions:\n" + "\n".join(offenders)


def _function(name: str, body_lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(body_lines))
    return f"{indent}def {name}() -> None:\n{body}"


def test_the_scan_finds_a_long_function_or_method() -> None:
    source = (_function("short", MAX_LINES - 1)  # exactly MAX_LINES lines: allowed
              + _function("long", MAX_LINES)
              + "class C:\n" + _function("method", MAX_LINES, "    ").replace(
                  "def method", "async def method"))
    assert long_functions(source, "m.py") == [
        f"m.py:{MAX_LINES + 1} long ({MAX_LINES + 1} lines)",
        f"m.py:{2 * MAX_LINES + 3} method ({MAX_LINES + 1} lines)",
    ]
