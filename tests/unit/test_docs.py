"""The docs follow the code: every metric, setting, flag and contract key the product defines is
in docs/reference.md, README.md stays a newcomer's page (under 300 lines, two set-up commands),
and every relative link in README.md and docs/*.md points at a file (and heading) that exists.

Each scan runs on the real code, found by walking it (importing the modules, or parsing them),
never from a list kept here; a test beside each shows the scan finding a small example, so a
check that passes is one that could have failed.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference.md"
# each product folder and the name it installs as (package-dir in pyproject.toml)
PRODUCT = {"slurmgate": "slurmgate", "webhook": "slurmgate.webhook",
           "binder": "slurmgate.binder", "certs": "slurmgate.certs"}
# where the processes read their settings (each parses its environment once, there)
CONFIGS = ("slurmgate/config.py", "webhook/config.py", "binder/config.py")
METRIC_TYPES = {"Counter", "Gauge", "Histogram", "Summary"}
README_MAX_LINES = 300
SETUP_COMMANDS = {"make demo", "make test"}


def _product_files() -> Iterator[tuple[Path, str]]:
    """(path, module name) of every product module."""
    for folder, package in PRODUCT.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [*path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            yield path, ".".join([package, *parts])


def _module_name(rel: str) -> str:
    return dict((str(p.relative_to(ROOT)), m) for p, m in _product_files())[rel]


def _mentioned(name: str, text: str) -> bool:
    """`name` appears in `text` as a whole token, not as a part of a longer name."""
    return re.search(rf"(?<![\w/.-]){re.escape(name)}(?![\w/-])", text) is not None


def _missing(names: Iterable[str], text: str) -> list[str]:
    return sorted(n for n in set(names) if not _mentioned(n, text))


def _reference() -> str:
    return REFERENCE.read_text()


# --- (1) metrics ---------------------------------------------------------------------------

def _imports_prometheus(tree: ast.AST) -> bool:
    return any((isinstance(n, ast.ImportFrom) and n.module == "prometheus_client")
               or (isinstance(n, ast.Import)
                   and any(a.name == "prometheus_client" for a in n.names))
               for n in ast.walk(tree))


def _metric_calls(src: str) -> list[ast.Call]:
    """Calls of prometheus_client's Counter/Gauge/Histogram/Summary in a module that imports it
    (collections.Counter elsewhere is not one)."""
    tree = ast.parse(src)
    if not _imports_prometheus(tree):
        return []
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Name) and n.func.id in METRIC_TYPES)
        or (isinstance(n.func, ast.Attribute) and n.func.attr in METRIC_TYPES))]


def metric_names_in_source(src: str) -> set[str]:
    """Names given as a plain string; f-string names are found in the registries instead."""
    return {c.args[0].value for c in _metric_calls(src) if c.args
            and isinstance(c.args[0], ast.Constant) and isinstance(c.args[0].value, str)}


def metrics_without_registry(src: str) -> list[int]:
    """Lines of metric constructors that name no registry: they would land in the default one,
    which neither process serves, and which the registry walk below does not read."""
    return [c.lineno for c in _metric_calls(src)
            if not any(k.arg == "registry" for k in c.keywords)]


def registry_metric_names(registry: CollectorRegistry) -> set[str]:
    """The names a registry exposes (a counter's with its `_total`)."""
    return {f.name + "_total" if f.type == "counter" else f.name for f in registry.collect()}


def product_registries() -> list[CollectorRegistry]:
    """Every CollectorRegistry a product module holds, found by importing them all."""
    found: dict[int, CollectorRegistry] = {}
    for _, module in _product_files():
        for value in vars(importlib.import_module(module)).values():
            if isinstance(value, CollectorRegistry) and value is not prometheus_client.REGISTRY:
                found[id(value)] = value
    return list(found.values())


def product_metric_names() -> set[str]:
    names: set[str] = set()
    for registry in product_registries():
        names |= registry_metric_names(registry)
    for path, _ in _product_files():
        names |= metric_names_in_source(path.read_text())
    return names


def test_every_metric_names_a_registry() -> None:
    loose = [f"{p.relative_to(ROOT)}:{line}" for p, _ in _product_files()
             for line in metrics_without_registry(p.read_text())]
    assert not loose, f"metrics without registry=: {loose}"


def test_every_metric_is_in_the_reference() -> None:
    names = product_metric_names()
    # both processes' registries were found, and each gave its metrics
    assert len(product_registries()) >= 2 and len(names) >= 30, names
    missing = _missing(names, _reference())
    assert not missing, f"metrics missing from docs/reference.md: {missing}"


def test_the_metric_scans_can_fail() -> None:
    src = ('from prometheus_client import Counter, Histogram\n'
           'A = Counter("demo_jobs_total", "h", registry=R)\n'
           'B = Histogram(f"{p}_seconds", "h")\n'
           'from collections import Counter as C\n')
    assert metric_names_in_source(src) == {"demo_jobs_total"}
    assert metrics_without_registry(src) == [3]
    assert metric_names_in_source('from collections import Counter\nc = Counter("ab")\n') == set()
    r = CollectorRegistry()
    Counter("demo_things", "h", ["kind"], registry=r)
    Histogram("demo_wait_seconds", "h", registry=r)
    assert registry_metric_names(r) == {"demo_things_total", "demo_wait_seconds"}
    text = "| `demo_things_total` | counter |\n| `demo_wait_seconds_total_x` |"
    assert _missing(registry_metric_names(r), text) == ["demo_wait_seconds"]
    # the default registry's own collectors are none of ours, and the walk leaves it out
    d = CollectorRegistry()
    for collector in (ProcessCollector, PlatformCollector, GCCollector):
        collector(registry=d)
    assert not registry_metric_names(d) & product_metric_names()


# --- (2) settings and flags ----------------------------------------------------------------

class _EnvReads(ast.NodeVisitor):
    """The names a module reads from its environment: `env.get(X)`, `env[X]`,
    `env_<kind>(env, X, ...)` (slurmgate.config's helpers), `os.environ.get(X)`,
    `os.environ[X]`, `os.getenv(X)`. X is a string, or a name resolved in the module's namespace
    (`grace.SETTING`); inside a helper that takes the name as a parameter it is skipped."""

    def __init__(self, namespace: Mapping[str, Any]) -> None:
        self.namespace = namespace
        self.params: list[set[str]] = [set()]
        self.names: set[str] = set()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        a = node.args
        self.params.append({x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]})
        self.generic_visit(node)
        self.params.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    @staticmethod
    def _is_env(node: ast.AST) -> bool:
        return ((isinstance(node, ast.Name) and node.id == "env")
                or (isinstance(node, ast.Attribute) and node.attr == "environ"))

    def _add(self, arg: ast.expr) -> None:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            self.names.add(arg.value)
            return
        if isinstance(arg, ast.Name) and arg.id in self.params[-1]:
            return  # a helper's own parameter: its callers name the variable
        value = eval(compile(ast.Expression(arg), "<env name>", "eval"), dict(self.namespace))
        assert isinstance(value, str), ast.unparse(arg)
        self.names.add(value)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "get" and self._is_env(f.value) \
                and node.args:
            self._add(node.args[0])
        elif isinstance(f, ast.Attribute) and f.attr == "getenv" and node.args:
            self._add(node.args[0])
        elif isinstance(f, ast.Name) and f.id.startswith("env_") and len(node.args) >= 2 \
                and self._is_env(node.args[0]):
            self._add(node.args[1])
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if self._is_env(node.value) and isinstance(node.ctx, ast.Load):
            self._add(node.slice)
        self.generic_visit(node)


def env_reads(src: str, namespace: Mapping[str, Any] | None = None) -> set[str]:
    v = _EnvReads(namespace or {})
    v.visit(ast.parse(src))
    return v.names


def flags_in_source(src: str) -> set[str]:
    """The `--flags` of argparse's add_argument calls."""
    return {a.value for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"
            for a in n.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
            and a.value.startswith("--")}


def config_settings() -> set[str]:
    """What the three config modules read from the environment."""
    names: set[str] = set()
    for rel in CONFIGS:
        module = importlib.import_module(_module_name(rel))
        names |= env_reads((ROOT / rel).read_text(), vars(module))
    return names


def test_every_setting_is_in_the_reference() -> None:
    settings = config_settings()
    # the shared ones and each process's own were found
    assert {"SLURMREST_URL", "TENANCY_CONFIGMAP", "SUBMIT_BUDGET", "BINDER_WORKERS"} <= settings
    missing = _missing(settings, _reference())
    assert not missing, f"settings missing from docs/reference.md: {missing}"


def test_every_other_environment_read_is_in_the_reference() -> None:
    # outside the configs: the Kubernetes client's in-cluster config, scontrol, crash points
    names: set[str] = set()
    for path, module in _product_files():
        src = path.read_text()
        if "environ" in src or "getenv" in src:
            names |= env_reads(src, vars(importlib.import_module(module)))
    missing = _missing(names, _reference())
    assert not missing, f"environment variables missing from docs/reference.md: {missing}"


def test_every_flag_is_in_the_reference() -> None:
    flags: set[str] = set()
    for path, _ in _product_files():
        flags |= flags_in_source(path.read_text())
    assert {"--listen", "--health-listen", "--out"} <= flags
    missing = _missing(flags, _reference())
    assert not missing, f"flags missing from docs/reference.md: {missing}"


def test_the_setting_scans_can_fail() -> None:
    src = ('import os\n'
           'def env_word(env, name):\n'
           '    return env.get(name)\n'
           'def load(env):\n'
           '    a = env.get("DEMO_A", "x")\n'
           '    b = env_int(env, "DEMO_B", 1)\n'
           '    c = env.get(grace.SETTING)\n'
           '    d = os.environ["DEMO_D"]\n'
           '    e = os.getenv("DEMO_E")\n'
           '    ap.add_argument("--demo-flag", default=a)\n'
           '    os.environ["DEMO_SET"] = "1"\n')
    grace = SimpleNamespace(SETTING="DEMO_C")  # stands for the module webhook/grace.py
    assert env_reads(src, {"grace": grace}) == {"DEMO_A", "DEMO_B", "DEMO_C", "DEMO_D",
                                                "DEMO_E"}
    assert flags_in_source(src) == {"--demo-flag"}
    text = "| `DEMO_A` | |\n| `DEMO_BB` | |\n--demo-flag"
    assert _missing({"DEMO_A", "DEMO_B", "--demo-flag"}, text) == ["DEMO_B"]


# --- (3) the annotation and label contract -------------------------------------------------

# an annotation, label or condition key (`prefix/name`), or a label selector `key=value`
_KEY = re.compile(r"[a-z0-9.-]+\.[a-z]+/[A-Za-z0-9._-]+(=[A-Za-z0-9._-]+)?")


def contract_keys(namespace: Mapping[str, Any]) -> dict[str, str]:
    """Every annotation and label key (and the job-state values of ours) a contract module
    defines, by constant name."""
    return {k: v for k, v in namespace.items() if k.isupper() and isinstance(v, str)
            and (_KEY.fullmatch(v) or k.startswith("JOB_STATE_"))}


def test_every_contract_key_is_in_the_reference() -> None:
    from slurmgate import contract
    keys = contract_keys(vars(contract))
    # every A_* annotation and *_LABEL label is among them: the pattern misses none
    named = {k for k in vars(contract) if k.startswith("A_") or k.endswith("_LABEL")}
    assert named and named <= keys.keys(), named - keys.keys()
    missing = _missing(keys.values(), _reference())
    assert not missing, f"contract keys missing from docs/reference.md: {missing}"


def test_the_contract_scan_can_fail() -> None:
    fake = {"DOMAIN": "demo.io", "A_THING": "demo.io/thing", "THING_LABEL": "demo.io/kind",
            "POD_LABEL": "app.kubernetes.io/name=demo", "JOB_STATE_X": "Waiting",
            "PREFIX": "demo: cordoned", "helper": "demo.io/not-a-constant"}
    keys = contract_keys(fake)
    assert keys == {"A_THING": "demo.io/thing", "THING_LABEL": "demo.io/kind",
                    "POD_LABEL": "app.kubernetes.io/name=demo", "JOB_STATE_X": "Waiting"}
    text = "`demo.io/thing-two` `demo.io/kind` `app.kubernetes.io/name=demo` Waiting"
    assert _missing(keys.values(), text) == ["demo.io/thing"]


# --- (4) README's size, and links ----------------------------------------------------------

_FENCE = re.compile(r"^(```|~~~)([^\n]*)\n(.*?)^\1[ \t]*$", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def _prose(md: str) -> str:
    """The text outside fenced code blocks."""
    return _FENCE.sub("", md)


def github_anchors(md: str) -> set[str]:
    """The anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces to
    hyphens; a repeated heading gets -1, -2, ..."""
    out: set[str] = set()
    for title in _HEADING.findall(_prose(md)):
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in out:
            n += 1
            candidate = f"{slug}-{n}"
        out.add(candidate)
    return out


def relative_links(md: str) -> list[str]:
    targets = _LINK.findall(_INLINE_CODE.sub("", _prose(md)))
    return [t for t in targets if not re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", t)]


def broken_links(path: Path) -> list[str]:
    out = []
    md = path.read_text()
    for target in relative_links(md):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            out.append(f"{path.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in github_anchors(dest.read_text()):
            out.append(f"{path.name}: {target} (no such heading)")
    return out


def test_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_every_relative_link_resolves() -> None:
    pages = [README, *sorted(DOCS.glob("*.md"))]
    assert len(pages) >= 7 and all(relative_links(p.read_text()) for p in pages[:2])
    broken = [b for p in pages for b in broken_links(p)]
    assert not broken, broken


def test_the_link_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text(
        "# Guide\n\n## Slurm's Nodes: tainted\n\n```sh\n# not a heading\n```\n## Guide\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/guide.md) [ok](docs/guide.md#slurms-nodes-tainted) [ok](#top)\n"
        "[ok](docs/guide.md#guide-1) [web](https://example.com/x.md) `[code](nowhere.md)`\n"
        "[gone](docs/missing.md) [bad](docs/guide.md#not-a-heading)\n"
        "[bad](docs/guide.md#not-a-heading-1)\n\n# Top\n")
    assert github_anchors((tmp_path / "docs" / "guide.md").read_text()) == {
        "guide", "slurms-nodes-tainted", "guide-1"}
    assert broken_links(page) == [
        "README.md: docs/missing.md (no such file)",
        "README.md: docs/guide.md#not-a-heading (no such heading)",
        "README.md: docs/guide.md#not-a-heading-1 (no such heading)",
    ]


# --- (5) README's set-up commands ----------------------------------------------------------

SHELL_INFO = {"", "sh", "bash", "shell", "console", "zsh", "shell-session"}


def shell_commands(md: str) -> list[str]:
    """The command lines of the fenced shell blocks (untagged ones count as shell), with
    comments and `$ ` prompts dropped."""
    out = []
    for _, info, body in _FENCE.findall(md):
        if info.strip().split(" ")[0].lower() not in SHELL_INFO:
            continue
        for line in body.splitlines():
            line = re.sub(r"^\s*\$\s+", "", line)
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line:
                out.append(" ".join(line.split()))
    return out


def other_setup_commands(md: str) -> list[str]:
    """Shell commands besides the two, and `make <target>`s in inline code besides them."""
    inline = [" ".join(m.split()) for code in _INLINE_CODE.findall(_prose(md))
              for m in re.findall(r"(?<![\w-])make\s+[\w-]+", code)]
    return [c for c in [*shell_commands(md), *inline] if c not in SETUP_COMMANDS]


def test_readme_has_the_two_commands_and_no_other() -> None:
    md = README.read_text()
    assert set(shell_commands(md)) == SETUP_COMMANDS, shell_commands(md)
    others = other_setup_commands(md)
    assert not others, f"README.md names set-up commands besides the two: {others}"


def test_the_command_check_can_fail() -> None:
    md = ("```sh\nmake demo   # the demo\n$ make test\n```\n\n"
          "```mermaid\nA->>B: make cluster-up\n```\n\n"
          "```bash\n# a comment\nSLURM_VERSION=24.11 make demo\n```\n\n"
          "```\nsource /tmp/slurmgate/env.sh\n```\n\n"
          "Run `make cluster-up` first; we make it easy.\n")
    assert shell_commands(md) == ["make demo", "make test", "SLURM_VERSION=24.11 make demo",
                                  "source /tmp/slurmgate/env.sh"]
    assert other_setup_commands(md) == ["SLURM_VERSION=24.11 make demo",
                                        "source /tmp/slurmgate/env.sh", "make cluster-up"]
    assert other_setup_commands("```sh\nmake demo\nmake test\n```\n`make demo`\n") == []
