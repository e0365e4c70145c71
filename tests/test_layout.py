"""The repository holds its known layout and nothing else: no scratch directories, no
databases or reports committed by mistake."""

from __future__ import annotations

import shutil
import subprocess

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
