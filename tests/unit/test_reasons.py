"""Every reason a user sees is named once, in slurmgate/reasons.py: a product module, a bench or
the chaos invariants that spell one out instead would drift from it unnoticed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from slurmgate import contract, reasons

ROOT = Path(__file__).resolve().parents[2]
# the product (its real folders, not the slurmgate/ symlinks to them), the benches, the tools
SCANNED = ("binder", "webhook", "certs", "slurmgate", "bench", "cluster")
OWN = {ROOT / "slurmgate" / "reasons.py"}


def _python_files() -> list[Path]:
    out = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path in OWN or any(p.is_symlink() for p in [path, *path.parents]
                                  if ROOT in p.parents):
                continue
            out.append(path)
    return out


def _forbidden() -> dict[str, str]:
    """value -> reason name. A reason that is also a contract value (a condition reason that
    is the Pod's job state) may appear where contract.py defines it, nowhere else."""
    return {v: k for k, v in reasons.all_reasons().items()}


def test_no_reason_is_spelt_out_outside_reasons_py() -> None:
    forbidden = _forbidden()
    contract_values = {v for k, v in vars(contract).items() if k.isupper() and isinstance(v, str)}
    retyped = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), str(path))
        exported = {e.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
                    for e in ast.walk(n.value) if isinstance(e, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in exported:
                continue  # a class of that name, exported (SlurmUnavailable)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    node.value in forbidden:
                if path.name == "contract.py" and node.value in contract_values:
                    continue
                retyped.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r} "
                               f"(use reasons.{forbidden[node.value]})")
    assert _python_files() and not retyped, "\n".join(retyped)


def test_the_scan_finds_a_retyped_reason(tmp_path: Path) -> None:
    # the check above can fail: the same walk finds a reason spelt out in a module
    src = f'emit(pod, "{reasons.EV_JOB_VANISHED}", "gone")\n'
    found = [n.value for n in ast.walk(ast.parse(src))
             if isinstance(n, ast.Constant) and n.value in _forbidden()]
    assert found == [reasons.EV_JOB_VANISHED]


def test_reasons_are_camel_case_and_distinct() -> None:
    named = reasons.all_reasons()
    assert len(named) >= 50
    bad = [k for k, v in named.items() if not re.fullmatch(r"(?:[A-Z][a-z0-9]*|QOS|GPUs?|CPU)+", v)]
    assert not bad, bad
    by_value: dict[str, list[str]] = {}
    for k, v in named.items():
        by_value.setdefault(v, []).append(k)
    assert not [ks for ks in by_value.values() if len(ks) > 1]


def test_every_reason_is_in_the_reference() -> None:
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob(
        "*.md"))])
    missing = [v for v in reasons.all_reasons().values() if v not in docs]
    assert not missing, f"reasons not documented: {missing}"
