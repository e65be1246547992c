"""The layout shows who runs what, held from the code's own imports (the AST, every import: module
level, deferred inside functions, and under ``TYPE_CHECKING``, since each is a dependency someone
must keep in mind):

- no import cycle among the modules of ``components/`` and ``scripts/``, each module its own node
  (the program imports its edges, the edges import ``components/context.py``, never the program
  back; the node programs name each other's types in one direction only);
- inside ``components/core`` (the pure core) every import points down a fixed stack of layers
  (``CORE_LAYERS``): the error type, the facts, the typed config and its checks, the domain over a
  spec, the checks that need the domain, the entry (``load.parse_spec``/``load_stack``); a module
  of no layer, or an import of a higher layer, fails naming both files;
- ``components/core`` imports nothing from Pulumi, the edges or ``scripts/``;
- ``components/`` imports nothing from ``scripts/``: the dispatcher (``scripts/cli.py``) sits above
  what it dispatches;
- the node programs (``scripts/node/``) import only the standard library, each other and, where
  used (never at module level), the packages of the image they run in; a ``python -I`` interpreter
  whose ``sys.path`` holds only ``scripts/node`` imports every one of them;
- every operator program (``scripts/ops/``) with a ``main(argv)`` is a ``kimi-deploy`` subcommand;
- one module holds the vLLM version: ``components/core/versions.py``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from components.core.versions import VLLM_VERSION
from scripts import cli
from tests.conftest import REPO_ROOT

PACKAGES = ("components", "scripts")
NODE_DIR = REPO_ROOT / "scripts" / "node"
# What the images that run the node programs carry beyond the standard library, imported only
# where used: the vLLM image (vLLM itself, boto3/botocore, huggingface_hub; awscrt when boto3 has
# its CRT extra) for weight_sync, engine_cache, the API guard and engine_check, and modelscope for
# a modelscope:// source (weight_sync/sources.py says to install it where that source is used).
IMAGE_PACKAGES = frozenset({"boto3", "botocore", "awscrt", "huggingface_hub", "modelscope", "vllm"})


def module_name(path: Path, root: Path = REPO_ROOT) -> str:
    """``components/aws/__init__.py`` -> ``components.aws``; ``scripts/ops/plan.py`` -> ``scripts.ops.plan``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(root: Path = REPO_ROOT, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``: dotted name -> file."""
    return {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}


def imported_names(path: Path, name: str) -> list[tuple[str, int, bool]]:
    """``(dotted module, line, at module level)`` for every import in the file ``path`` of module
    ``name``, relative imports resolved. ``from a.b import c`` names ``a.b.c`` and ``a.b`` (the
    caller keeps the one that is a module). At module level: not inside a function or class body."""
    tree = ast.parse(path.read_text(), str(path))
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
              for n in ast.walk(f) if n is not f}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, int, bool]] = []
    for node in ast.walk(tree):
        top = id(node) not in nested
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno, top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            out.append((stem, node.lineno, top))
            out += [(f"{stem}.{alias.name}", node.lineno, top) for alias in node.names]
    return out


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports. ``from a.b import c`` is an edge to ``a.b.c`` when
    that is a module, else to ``a.b`` (c is a name defined there); any other name resolves to the
    longest module it starts with. A submodule's implicit import of its parent package is no edge:
    a package re-exporting its own modules is not a cycle."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = imported_names(path, name)
        named_modules = {imported for imported, _, _ in found if imported in modules}
        targets = set()
        for imported, line, _ in found:
            if any(other.startswith(imported + ".") and other in named_modules
                   for other, other_line, _ in found if other_line == line):
                continue  # `from a.b import c` with a.b.c a module: the edge is to a.b.c
            parts = imported.split(".")
            for end in range(len(parts), 0, -1):
                candidate = ".".join(parts[:end])
                if candidate in modules:
                    targets.add(candidate)
                    break
        targets.discard(name)
        graph[name] = targets
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


MODULES = project_modules()
GRAPH = import_graph(MODULES)


def _imports_of(prefix: str) -> Iterable[tuple[str, str, int, bool]]:
    for name, path in MODULES.items():
        if name == prefix or name.startswith(prefix + "."):
            for imported, line, top in imported_names(path, name):
                yield name, imported, line, top


def test_no_import_cycle_among_components_and_scripts():
    assert cycles(GRAPH) == []


def test_the_cycle_finder_finds_the_edge_importing_the_program_back():
    """The old shape: the program imports an edge, the edge imports the program's context type."""
    graph = {**GRAPH, "components.aws": GRAPH["components.aws"] | {"components.program"}}
    assert any({"components.aws", "components.program"} <= set(c) for c in cycles(graph))
    assert "components.aws" in GRAPH["components.program"]  # the program does import its edges


# The layers of the pure core, bottom first: a module may import its own layer and those below,
# never one above. Entries are modules of components/core (a package stands for all its modules).
CORE = "components.core"
CORE_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # ConfigError and the helpers that word its messages: imports nothing of the project.
    ("errors", ("errors",)),
    # What is true whatever a stack says: hardware, versions, prices, names, limits, formats of the
    # model's KV cache, the platforms' profiles. Functions of these facts only, never of a config.
    ("facts", ("", "attention_backend", "capacity", "controller_objects", "crd_rules", "credentials", "engine_memory", "examples",
               "fsx", "k8s_schema", "kv_layout", "limits", "metrics", "model", "naming", "node_storage", "platforms",
               "prices", "scheduler_limits", "targets", "versions", "vllm_options")),
    # The typed config: the pydantic models of the YAML (each key's type, range and format), the
    # frozen DeploymentSpec, the stack file and the config reader.
    ("typed config", ("config.patterns", "config.raw", "config.reader", "config.spec", "config.stack_file")),
    # The config's checks, one module per section: each key alone, and the rules between keys that
    # need only the facts. Each takes the raw config and what parse_spec resolved once (the
    # platform's profile, the target, the model). The package (config/__init__) re-exports both.
    ("config checks", ("config",)),
    # What a spec becomes: sizing, the time model, weights, the engine, the vLLM command, scaling,
    # scraping, the engine cache, pod security, cost.
    ("domain", ("cost", "engine", "engine_cache", "pod_security", "scaling", "scraping", "sizing", "time_inputs",
                "time_to_ready", "vllm", "weights")),
    # The checks of a config that need the domain (the engine build serves the model).
    ("checks", ("checks",)),
    # parse_spec and load_stack: run the config's checks, build the spec, run the domain checks.
    ("entry", ("load",)),
)


def core_layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = CORE_LAYERS) -> int | None:
    """The index in ``layers`` of a module of ``components/core`` (the longest entry it falls under), else None."""
    best: tuple[int, int] | None = None
    for index, (_, members) in enumerate(layers):
        for member in members:
            full = f"{CORE}.{member}" if member else CORE
            if (module == full or (member and module.startswith(full + "."))) and (best is None or len(full) > best[1]):
                best = (index, len(full))
    return None if best is None else best[0]


def _import_lines(name: str, target: str) -> list[int]:
    """Lines of module ``name`` whose import resolves to module ``target`` (for the message)."""
    return sorted({line for imported, line, _ in imported_names(MODULES[name], name)
                   if imported == target or imported.startswith(target + ".")}) or [0]


def upward_imports(graph: Mapping[str, set[str]],
                   layers: tuple[tuple[str, tuple[str, ...]], ...] = CORE_LAYERS) -> list[str]:
    """Every import inside the core that points to a higher layer, as ``file:line (layer) imports
    file (layer)``; a module of the core in no layer is reported too."""
    problems = []
    for name in sorted(n for n in graph if n == CORE or n.startswith(CORE + ".")):
        own = core_layer_of(name, layers)
        if own is None:
            problems.append(f"{MODULES[name].relative_to(REPO_ROOT)} is in no layer of CORE_LAYERS: add it to one")
            continue
        for target in sorted(graph[name]):
            if not (target == CORE or target.startswith(CORE + ".")):
                continue
            theirs = core_layer_of(target, layers)
            if theirs is not None and theirs > own:
                where = ",".join(str(n) for n in _import_lines(name, target))
                problems.append(f"{MODULES[name].relative_to(REPO_ROOT)}:{where} ({layers[own][0]}) imports "
                                f"{MODULES[target].relative_to(REPO_ROOT)} ({layers[theirs][0]}), a higher layer")
    return problems


def test_the_core_imports_only_down_its_layers():
    assert upward_imports(GRAPH) == []


def test_the_layer_check_names_both_files_of_an_upward_import():
    """The old shape: the config's storage check imported sizing, a domain module."""
    graph = {**GRAPH, "components.core.config.storage": GRAPH["components.core.config.storage"] | {"components.core.sizing"}}
    [problem] = upward_imports(graph)
    assert problem.startswith("components/core/config/storage.py:0 (config checks) imports components/core/sizing.py (domain)")
    assert cycles(graph) == []  # an upward import need not close a circle: the layer check is its own


def test_every_layer_member_is_a_module_and_every_core_module_has_one_layer():
    core = sorted(n for n in MODULES if n == CORE or n.startswith(CORE + "."))
    assert [n for n in core if core_layer_of(n) is None] == []
    listed = [f"{CORE}.{m}" if m else CORE for _, members in CORE_LAYERS for m in members]
    assert sorted(m for m in listed if m not in MODULES) == []
    assert len(listed) == len(set(listed))


def test_the_edges_take_the_context_from_its_own_module():
    for edge in ("components.aws", "components.k8s", "components.k8s.existing_cluster"):
        assert "components.context" in GRAPH[edge] and "components.program" not in GRAPH[edge], edge
    assert not GRAPH["components.context"] & {n for n in MODULES if n.startswith(("components.aws", "components.k8s"))}


def test_the_pure_core_imports_no_pulumi_no_edge_and_no_scripts():
    forbidden = re.compile(r"^(pulumi|pulumi_\w+|components\.(aws|k8s|program|context|platform|plan_engine)|scripts)(\.|$)")
    offenders = [f"{name}:{line} {imported}" for name, imported, line, _ in _imports_of("components.core")
                 if forbidden.match(imported)]
    assert offenders == []


def test_components_import_nothing_from_scripts():
    offenders = [f"{name}:{line} {imported}" for name, imported, line, _ in _imports_of("components")
                 if imported == "scripts" or imported.startswith("scripts.")]
    assert offenders == []


def _node_files() -> list[Path]:
    return sorted(NODE_DIR.rglob("*.py"))


def _node_siblings() -> set[str]:
    """Top-level names a node program may import beside the standard library: its own files and
    packages in scripts/node (a node holds them side by side, or inside the zipapp)."""
    return {p.stem for p in NODE_DIR.glob("*.py")} | {p.name for p in NODE_DIR.iterdir() if (p / "__init__.py").is_file()}


def node_import_problems(files: Iterable[Path], root: Path = NODE_DIR) -> list[str]:
    """Imports in node programs that a node cannot satisfy: anything outside the standard library,
    the node programs themselves (relative imports inside a package included) and, only inside a
    function, ``IMAGE_PACKAGES``."""
    problems = []
    siblings = _node_siblings()
    for path in files:
        name = module_name(path, root)
        tree = ast.parse(path.read_text(), str(path))
        relative = {id(n) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level}
        for imported, line, top in imported_names(path, name):
            first = imported.split(".")[0]
            if first in sys.stdlib_module_names or first in siblings or first == "__future__":
                continue
            if any(isinstance(n, ast.ImportFrom) and n.lineno == line and id(n) in relative for n in ast.walk(tree)):
                continue
            if first in IMAGE_PACKAGES and not top:
                continue
            if any(f":{line} imports " in problem and problem.startswith(str(path)) for problem in problems):
                continue  # `from a import b`: one problem per import statement
            where = "at module level" if first in IMAGE_PACKAGES else "outside scripts/node"
            problems.append(f"{path}:{line} imports {imported} ({where})")
    return problems


def test_node_programs_import_only_the_standard_library_and_each_other():
    assert _node_files(), "no node programs found"
    assert node_import_problems(_node_files()) == []


def test_the_node_import_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nimport boto3\nfrom components.core import naming\n\ndef f():\n    import boto3\n")
    problems = node_import_problems([bad], tmp_path)
    assert len(problems) == 2 and "boto3 (at module level)" in problems[0] and "components.core" in problems[1]


def _node_modules() -> list[str]:
    """Importable names of the node programs with only scripts/node on sys.path."""
    names = []
    for path in _node_files():
        rel = path.relative_to(NODE_DIR).with_suffix("")
        if rel.parts == ("__init__",) or rel.name == "__main__":
            continue
        names.append(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
    return sorted(names)


def test_each_node_program_imports_in_an_isolated_interpreter_with_only_scripts_node():
    """``python -I -S`` (no PYTHONPATH, no user site, no script directory, no site-packages: so no
    editable install of the project and no third-party package) with sys.path the standard library
    and scripts/node: every node module imports, and nothing of the project comes with it."""
    names = _node_modules()
    assert {"weight_sync", "weight_sync.sources", "engine_cache", "kimi_vllm_api_guard", "engine_check"} <= set(names)
    code = (
        "import sys, importlib\n"
        "assert not any('site-packages' in p for p in sys.path), sys.path\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "for name in sys.argv[2:]:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('components', 'scripts', 'tests', 'boto3', 'botocore',"
        " 'huggingface_hub', 'vllm', 'pulumi'))\n"
        "print('ok' if not bad else bad)\n"
    )
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(NODE_DIR), *names], capture_output=True, text=True,
                          timeout=120, cwd="/", env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:] + proc.stdout


def _operator_programs() -> list[str]:
    """Modules of scripts/ops with a top-level ``main`` that takes an argument list."""
    found = []
    for name, path in MODULES.items():
        if not name.startswith("scripts.ops."):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name == "main" and (node.args.args or node.args.posonlyargs):
                found.append(name)
    return sorted(found)


def test_kimi_deploy_reaches_every_operator_program():
    programs = _operator_programs()
    assert {"scripts.ops.plan", "scripts.ops.preflight", "scripts.ops.deploy_policy"} <= set(programs)
    dispatched = {sub.module for sub in cli.SUBCOMMANDS.values()}
    assert sorted(set(programs) - dispatched) == []


def test_nothing_below_the_dispatcher_imports_it():
    importers = sorted(name for name, targets in GRAPH.items() if "scripts.cli" in targets)
    assert importers == []


# Where the version may appear as a literal outside components/core/versions.py, and why:
# - requirements-vllm.txt: pip's pin (`vllm==X`) of the parser venv; pip cannot read versions.py,
#   and tests/vllm_contract.py fails when the pin and VLLM_VERSION differ;
# - README.md and docs/: prose for people, with the command output they quote;
# - tests/: expectations about the real wheel and recorded fixtures (data, not a pin).
# The parser's option table records the release it was generated from (checked to be VLLM_VERSION below).
OPTION_TABLE = "components/core/data/vllm_serve_options.json"
VERSION_LITERAL_ALLOWED = ("components/core/versions.py", "requirements-vllm.txt", "README.md", "docs/", "tests/",
                           OPTION_TABLE)


def version_literals(text: str, version: str) -> list[int]:
    """Lines of ``text`` holding ``version`` as a value: a whole string (``"0.33.0"``), a pin
    (``==0.33.0``) or an image tag (``v0.33.0``, ``:v0.33.0``). A citation in prose ("read in
    vLLM 0.33.0's vllm/x.py", the project's rule for naming the source of a fact) is not one."""
    v = re.escape(version)
    pattern = re.compile(rf"""(["']{v}["']|==\s*{v}(?![\w.])|(?<![\w.])v{v}(?![\w.]))""")
    return [i for i, line in enumerate(text.splitlines(), 1) if pattern.search(line)]


def test_one_module_holds_the_vllm_version():
    files = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, text=True, check=True).stdout.split("\0")
    offenders = []
    for rel in filter(None, files):
        path = REPO_ROOT / rel
        if rel.startswith(VERSION_LITERAL_ALLOWED) or not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        offenders += [f"{rel}:{line}" for line in version_literals(text, VLLM_VERSION)]
    assert offenders == []
    assert version_literals((REPO_ROOT / "components/core/versions.py").read_text(), VLLM_VERSION)
    # A release bump without regenerating the option table (scripts/dev/vllm_option_table.py) fails here.
    assert json.loads((REPO_ROOT / OPTION_TABLE).read_text())["vllm_version"] == VLLM_VERSION


@pytest.mark.parametrize("line, is_literal", [
    ('VLLM_VERSION = "0.33.0"', True), ("vllm==0.33.0", True), ("image: vllm/vllm-openai:v0.33.0", True),
    ("# the default v0.33.0 lacks it", True), ("# read in the vLLM 0.33.0 wheel (vllm/x.py)", False),
    ("vllm==0.33.01", False), ("v0.33.0.1", False),
])
def test_the_version_literal_check_can_fail(line, is_literal):
    assert bool(version_literals(line, "0.33.0")) is is_literal
