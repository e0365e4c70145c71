"""The repository holds its known layout and nothing else: no scratch directories, no
databases or reports committed by mistake; and the environments the gates make beside
.venv name what is there."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tomllib
from types import ModuleType

import pytest

from tests.conftest import ROOT

KNOWN = {
    ".ci", ".github", ".gitignore", "LICENSE", "README.md", "pyproject.toml",
    "src", "tests", "docs", "reports", "scripts", "benchmarks", "examples",
}  # fmt: skip
SCRATCH = (".sqlite", ".sqlite-wal", ".sqlite-shm", ".log", ".jsonl")


def tracked() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an sdist or a copy): nothing is tracked")
    listing = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True, timeout=60)  # fmt: skip
    return listing.stdout.splitlines()


def test_every_tracked_file_sits_in_the_known_layout() -> None:
    files = tracked()
    assert {path.split("/")[0] for path in files} <= KNOWN
    assert [path for path in files if path.startswith("reports/")] == ["reports/.gitkeep"]
    assert [path for path in files if path.endswith(SCRATCH)] == []


def _gates() -> ModuleType:
    """scripts/gates.py as a module (stdlib only: importing it runs nothing)."""
    name = "scripts_gates"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "gates.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # where its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


def test_each_environment_beside_the_main_one_names_what_exists_and_only_its_own() -> None:
    """pyproject.toml's [tool.crashqueuelab.environments], as the gates and the suite read
    it: extras the project declares and the main environment lacks, sources and tests that
    exist, tests under tests/ that no other environment claims."""
    gates = _gates()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = set(project["project"]["optional-dependencies"])
    assert gates.APART, "no environment beside the main one"
    claimed: list[str] = []
    for apart in gates.APART:
        assert set(apart.extras) <= declared, apart.name
        assert set(apart.extras) - set(gates.EXTRAS), f"{apart.name} adds nothing to .venv"
        assert apart.imports, apart.name
        for path in (*apart.sources, *apart.tests):
            assert (ROOT / path).exists(), f"{apart.name}: {path} does not exist"
        assert all(test.startswith("tests/") and test.endswith(".py") for test in apart.tests)
        claimed += apart.tests
        assert apart.venv(ROOT / ".venv") == ROOT / f".venv-{apart.name}"
        assert apart.venv(ROOT / ".venv-3.13") == ROOT / f".venv-{apart.name}-3.13"
    assert len(claimed) == len(set(claimed))
