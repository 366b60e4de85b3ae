"""The package layout the installed distribution relies on.

webhook/, binder/ and certs/ are top-level folders in the checkout but install only as
slurmgate.webhook, slurmgate.binder and slurmgate.certs (symlinks in slurmgate/), so an import
of a bare `binder` would work from a checkout and fail once installed.
"""

from __future__ import annotations

import re
from pathlib import Path

import grimp  # comes with import-linter (the dev extra)
import pytest

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = ("webhook", "binder", "certs")
BARE = re.compile(rf"^\s*(from|import)\s+({'|'.join(PROCESSES)})(\.|\s|$)", re.M)
SOURCES = ("slurmgate", "cluster", "bench", "tests", *PROCESSES)


@pytest.mark.parametrize("name", PROCESSES)
def test_process_folder_is_a_slurmgate_subpackage(name: str) -> None:
    link = ROOT / "slurmgate" / name
    assert link.is_symlink() and link.resolve() == (ROOT / name).resolve()
    assert (link / "__main__.py").is_file()


def test_nothing_imports_a_process_by_its_bare_name() -> None:
    offenders = [f"{p.relative_to(ROOT)}: {m.group(0).strip()}"
                 for top in SOURCES for p in (ROOT / top).rglob("*.py")
                 if not p.is_relative_to(ROOT / "slurmgate" / "webhook")
                 for m in BARE.finditer(p.read_text())]
    assert not offenders, offenders


def test_no_import_cycles() -> None:
    graph = grimp.build_graph("slurmgate", "cluster", "bench")
    cycles = sorted({tuple(sorted((a, b))) for a in graph.modules
                     for b in graph.find_modules_directly_imported_by(a)
                     if graph.chain_exists(importer=b, imported=a)})
    assert not cycles, cycles
