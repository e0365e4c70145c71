"""The layout is the architecture: every package imports only the packages below it.

Read from the source's own imports (also those inside functions, and those only a type
checker follows): a package may import itself and any package of a lower layer, never one
of its own layer or above. ``docs/architecture.md`` draws the same order.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

SRC = ROOT / "src"

#: From the bottom up. Packages on one line are siblings: neither imports the other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("walqueue", "crashqueuelab.core"),
    ("crashqueuelab.postgres", "crashqueuelab.judges"),
    # The package's face: DurableQueue, its errors, the judges' entry points.
    ("crashqueuelab",),
    ("crashqueuelab.servers",),
    ("crashqueuelab.systems",),
    ("crashqueuelab.lab.runs",),
    ("crashqueuelab.lab.workloads",),
    ("crashqueuelab.lab.faults",),
    (
        "crashqueuelab.lab.campaign",
        "crashqueuelab.lab.chaos",
        "crashqueuelab.lab.heartbeats",
        "crashqueuelab.lab.deploys",
        "crashqueuelab.lab.bench",
        "crashqueuelab.lab.versions",
        "crashqueuelab.lab.failover",
    ),
    ("crashqueuelab.lab.reproducers",),
    ("crashqueuelab.lab.mutants", "crashqueuelab.lab.demo"),
    ("crashqueuelab.lab.showcase",),
    ("crashqueuelab.lab.pages",),
    # The public face of the reruns that exported reproducers call.
    ("crashqueuelab.regression",),
    ("crashqueuelab.suite",),
    ("crashqueuelab.cli",),
    ("crashqueuelab.__main__", "crashqueuelab_pytest"),
)
RANK = {package: rank for rank, layer in enumerate(LAYERS) for package in layer}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str:
    """The layer's package a module belongs to: the longest listed prefix."""
    candidates = [p for p in RANK if module == p or module.startswith(p + ".")]
    if not candidates:
        raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS")
    return max(candidates, key=len)


def imports(path: Path, modules: set[str]) -> Iterator[tuple[int, str]]:
    """Every module of this project ``path`` imports (``from a import b`` imports ``a.b``
    where that is a module), with its line."""
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names = [base]
            names += [f"{base}.{alias.name}" for alias in node.names]
            names = [name for name in names if name in modules] or [base]
        else:
            continue
        for name in names:
            if name.split(".")[0] in {"crashqueuelab", "walqueue", "crashqueuelab_pytest"}:
                yield node.lineno, name


def sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_every_module_belongs_to_a_layer() -> None:
    for path in sources():
        package_of(module_name(path))


@pytest.mark.parametrize("path", sources(), ids=lambda path: str(path.relative_to(SRC)))
def test_a_module_imports_only_its_own_package_and_the_layers_below(path: Path) -> None:
    mine = package_of(module_name(path))
    wrong = []
    for line, name in imports(path, {module_name(source) for source in sources()}):
        theirs = package_of(name)
        if theirs != mine and RANK[theirs] >= RANK[mine]:
            wrong.append(f"line {line}: {name} ({theirs}, layer {RANK[theirs]} >= {RANK[mine]})")
    assert not wrong, f"{mine} (layer {RANK[mine]}) imports upwards or sideways: " + "; ".join(
        wrong
    )


def test_the_layer_table_names_only_packages_that_exist() -> None:
    modules = {module_name(path) for path in sources()}
    assert set(RANK) <= modules


def test_no_module_imports_itself_through_others() -> None:
    """No import circle between modules, within a package or across (Tarjan's strongly
    connected components over every import, also those inside functions)."""
    modules = {module_name(path): path for path in sources()}
    edges = {
        module: {name for _, name in imports(path, set(modules)) if name in modules} - {module}
        for module, path in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in edges[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    assert circles == []
