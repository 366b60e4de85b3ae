"""The package layout the installed distribution relies on, without symlinks.

webhook/, binder/ and certs/ are top-level folders in the checkout and install only as
slurmgate.webhook, slurmgate.binder and slurmgate.certs (package-dir in pyproject.toml). Inside
a folder, imports of its own modules are relative. So: a bare `import binder` would work from a
checkout and fail once installed; an absolute `slurmgate.binder` import in product code is one
import-linter (which sees the folders as packages webhook, binder, certs) cannot follow.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import grimp  # comes with import-linter (the dev extra)

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = ("webhook", "binder", "certs", "pinning")
PRODUCT = ("slurmgate", *PROCESSES)
BARE = re.compile(rf"^\s*(from|import)\s+({'|'.join(PROCESSES)})(\.|\s|$)", re.M)
SOURCES = ("slurmgate", "cluster", "bench", "tests", *PROCESSES)


def test_nothing_imports_a_process_by_its_bare_name() -> None:
    offenders = [f"{p.relative_to(ROOT)}: {m.group(0).strip()}"
                 for top in SOURCES for p in (ROOT / top).rglob("*.py")
                 for m in BARE.finditer(p.read_text())]
    assert not offenders, offenders


def test_no_import_cycles() -> None:
    graph = grimp.build_graph("slurmgate", *PROCESSES, "cluster", "bench")
    cycles = sorted({tuple(sorted((a, b))) for a in graph.modules
                     for b in graph.find_modules_directly_imported_by(a)
                     if graph.chain_exists(importer=b, imported=a)})
    assert not cycles, cycles


def _absolute_process_imports(src: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(src)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [])
        out += [n for n in names if n.split(".")[:2] in (["slurmgate", p] for p in PROCESSES)]
        if isinstance(node, ast.ImportFrom) and node.module == "slurmgate" and not node.level:
            out += [f"slurmgate.{a.name}" for a in node.names if a.name in PROCESSES]
    return out


def test_product_code_never_imports_a_process_by_its_installed_name() -> None:
    found = [f"{p.relative_to(ROOT)}: {name}"
             for top in PRODUCT for p in sorted((ROOT / top).rglob("*.py"))
             for name in _absolute_process_imports(p.read_text())]
    assert not found, found


def test_the_check_sees_each_form_of_such_an_import() -> None:
    assert _absolute_process_imports(
        "import slurmgate.binder.jobs\nfrom slurmgate.webhook import admission\n"
        "from slurmgate import certs\nfrom . import jobs\nfrom slurmgate import contract\n") == [
        "slurmgate.binder.jobs", "slurmgate.webhook", "slurmgate.certs"]


def test_no_symlink_in_the_tree() -> None:
    staged = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.splitlines()
    links = [line.split("\t", 1)[1] for line in staged if line.startswith("120000")]
    assert staged and not links, links


def test_the_installed_names_are_the_folders() -> None:
    import slurmgate.binder.controller
    import slurmgate.certs.pki
    import slurmgate.pinning.spec
    import slurmgate.webhook.admission
    for module, folder in ((slurmgate.binder.controller, "binder"),
                           (slurmgate.webhook.admission, "webhook"),
                           (slurmgate.certs.pki, "certs"),
                           (slurmgate.pinning.spec, "pinning")):
        assert Path(module.__file__ or "").parent == ROOT / folder


def test_the_decisions_and_the_job_model_load_without_an_http_stack() -> None:
    """The pure decisions (binder/decide.py, webhook/decide.py) and the job model they read are
    importable, and testable, without aiohttp: a fresh interpreter imports them and no aiohttp
    module is loaded. The same check sees aiohttp once the client is asked for."""
    probe = ("import sys; import slurmgate.binder.decide, slurmgate.webhook.decide, "
             "slurmgate.slurm.models; print(sorted(m for m in sys.modules if m.startswith("
             "'aiohttp')) or 'none'); from slurmgate.slurm import SlurmClient; "
             "print('aiohttp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["none", "True"], out
