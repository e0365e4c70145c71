"""The repository holds its known layout and nothing else: no scratch directories, no
databases or reports committed by mistake; and the environments the gates make beside
.venv name what is there."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
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


def test_the_gates_keep_the_directories_of_failed_tests_and_leave_sockets_and_big_files(
    tmp_path: Path,
) -> None:
    import socket
    import tempfile

    gates = _gates()
    # Short: a Unix socket's path must stay under 108 bytes.
    scratch = gates.Scratch(Path(tempfile.mkdtemp(prefix="k")))
    try:
        # The parallel part's own directory (a worker's), and one run without workers.
        run = scratch.basetemp("parallel") / "popen-gw1"
        alone = scratch.basetemp("redis5") / "test_c_y_0"
        alone.mkdir(parents=True)
        (alone / "log").write_text("said")
        failed = run / "test_dramatiq_1_10_0_runs_a_st0"
        (failed / "m" / "1.11.0").mkdir(parents=True)
        (failed / "m" / "1.11.0" / "heartbeats.json").write_text("{}")
        (failed / "big").write_bytes(b"\0" * (gates.KEPT_FILE_BYTES + 1))
        (run / "test_dramatiq_1_10_0_runs_a_stcurrent").symlink_to(failed)
        (run / "test_other0").mkdir()
        grouped = run / "test_a_partition_splits_a_mirr0"
        grouped.mkdir()
        (run / "test_b_x_0").mkdir()  # test_b[x]'s directory, a test that passed
        with socket.socket(socket.AF_UNIX) as listening:
            listening.bind(str(failed / "s"))
            kept = scratch.keep_failed(
                [
                    "tests/lab/heartbeats/test_pauses.py::"
                    "test_dramatiq_1_10_0_runs_a_stopped_workers_prefetched_message_twice"
                    " (in call)",
                    "tests/a.py::test_c[y] (in setup)",
                    # A test of an xdist group: the group is no part of its directory's name.
                    "tests/lab/failover/test_rabbitmq.py::test_a_partition_splits_a_mirrored"
                    "_queue_in_two@tests.lab.failover.test_rabbitmq::cluster (in call)",
                ],
                tmp_path / "kept",
            )
    finally:
        scratch.remove()
    copy = tmp_path / "kept" / "popen-gw1" / "test_dramatiq_1_10_0_runs_a_st0"
    assert kept == [
        tmp_path / "kept" / "popen-gw1" / "test_a_partition_splits_a_mirr0",
        copy,
        tmp_path / "kept" / "pytest-redis5" / "test_c_y_0",
    ]
    assert (kept[2] / "log").read_text() == "said"
    assert (copy / "m" / "1.11.0" / "heartbeats.json").read_text() == "{}"
    assert sorted(path.name for path in copy.iterdir()) == ["m"]
    # A second run's keeping replaces the first's.
    assert scratch.keep_failed([], tmp_path / "kept") == []
    assert not (tmp_path / "kept").exists()


def test_the_gates_write_every_file_of_their_tools_under_their_scratch_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gates = _gates()
    # A host that says not to write compiled modules at all: the gates write them, but
    # under the scratch directory, never beside the sources.
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = gates.Scratch(tmp_path).environment()
    assert "PYTHONDONTWRITEBYTECODE" not in env
    for name in ("PYTHONPYCACHEPREFIX", "COVERAGE_FILE", "MYPY_CACHE_DIR", "RUFF_CACHE_DIR"):
        assert Path(env[name]).is_relative_to(tmp_path), name
    assert env["TMPDIR"] == str(tmp_path / "tmp")
