"""The package's shape: no import cycles, a light import for producers, one worker module run."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import sqla_jobs

PACKAGE = Path(sqla_jobs.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """sqla_jobs modules ``path`` imports anywhere (lazy imports too), not under TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in modules else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    me = _module_name(path)
    # A package's own name is where a name is imported from, not a dependency on itself.
    return {m for m in found if m in modules and m != me and not me.startswith(m + ".")}


#: The one import against the layering, made inside functions that run only after both
#: modules are loaded: Job's flush listeners (in models, so that any import of Job has
#: them) call the producer, which needs the models.
DEFERRED = {("sqla_jobs.models", "sqla_jobs.producer")}


def test_the_package_has_no_import_cycles() -> None:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "versions" not in p.parts}
    graph = {name: _imports(path, set(paths)) for name, path in paths.items()}
    for importer, imported in DEFERRED:
        graph[importer].discard(imported)
    cycles: list[list[str]] = []

    def walk(node: str, stack: list[str]) -> None:
        if node in stack:
            cycles.append([*stack[stack.index(node) :], node])
            return
        for nxt in sorted(graph[node]):
            walk(nxt, [*stack, node])

    for start in sorted(graph):
        walk(start, [])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles[:10])


def test_importing_sqla_jobs_to_enqueue_imports_neither_alembic_nor_the_worker() -> None:
    code = (
        "import sys, sqla_jobs; sqla_jobs.enqueue; "
        "print(sorted(m for m in sys.modules if m == 'alembic' or m.startswith('sqla_jobs.worker')"
        " or m == 'sqla_jobs.migrations'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_python_m_sqla_jobs_worker_runs_the_worker_code_once() -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sqla_jobs.worker", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "usage: python -m sqla_jobs.worker" in proc.stdout
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()]
    # At most once: --help needs none of it (the package loads it lazily, #23).
    assert imported.count("sqla_jobs.worker._supervisor") <= 1
    # __main__ only calls the entry point: the worker's code is not run a second time.
    main = (PACKAGE / "worker" / "__main__.py").read_text()
    assert "class " not in main and "def " not in main
