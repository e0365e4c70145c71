"""Every test and quality gate, from a fresh clone with only python3 (>= 3.11) on PATH.

    python3 scripts/gates.py                       # all gates, in .venv
    python3 scripts/gates.py --pytest-only --python /path/to/python3.13

It makes (or reuses) a virtual environment, installs the project with its dev extra, then
runs: pytest with branch coverage >= 95% and ResourceWarning as an error, ruff check,
ruff format --check, mypy --strict, python -m build, and the built wheel installed into a
clean virtual environment running a real submit/claim/succeed/check round trip.
Stdlib only, so it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# No pip step may wait forever on a registry; no gate may run away.
STEP_TIMEOUT_S = 1800


def _log(message: str) -> None:
    print(f"[gates] {message}", file=sys.stderr, flush=True)


def _run(command: Sequence[str | Path], *, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    _log("$ " + " ".join(str(part) for part in command))
    return subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        check=False,
        text=True,
        timeout=STEP_TIMEOUT_S,
    )


def _capture(command: Sequence[str | Path], *, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        check=False,
        text=True,
        capture_output=True,
        timeout=STEP_TIMEOUT_S,
    )


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _prepare_venv(python: str, venv: Path) -> Path:
    if not _venv_python(venv).exists() and _run([python, "-m", "venv", venv]).returncode != 0:
        raise SystemExit(f"could not create a virtual environment at {venv}")
    interpreter = _venv_python(venv)
    pip: list[str | Path] = [interpreter, "-m", "pip", "--disable-pip-version-check", "-q"]
    if _run([*pip, "install", "-e", ".[dev,peers,reports,powerloss,postgres]"]).returncode != 0:
        raise SystemExit("could not install the project with its dev extra")
    return interpreter


def _wheel_round_trip(python: str, dist: Path) -> bool:
    """Install the built wheel alone into a clean venv and drive a real round trip."""
    wheels = sorted(dist.glob("crashqueuelab-*.whl"))
    if len(wheels) != 1:
        _log(f"expected one wheel in {dist}, found {[w.name for w in wheels]}")
        return False
    with tempfile.TemporaryDirectory(prefix="crashqueuelab-wheel-") as scratch:
        home = Path(scratch)
        venv = home / "venv"
        if _run([python, "-m", "venv", venv]).returncode != 0:
            return False
        pip: list[str | Path] = [
            _venv_python(venv),
            "-m",
            "pip",
            "--disable-pip-version-check",
            "-q",
        ]
        if _run([*pip, "install", "--no-deps", wheels[0]]).returncode != 0:
            return False
        cli = venv / "bin" / "crashqueuelab"
        if _capture([cli, "--help"], cwd=home).returncode != 0:
            _log("crashqueuelab --help failed from the installed wheel")
            return False
        database = str(home / "queue.sqlite")
        steps = [
            ["submit", "--idempotency-key", "wheel-1", "--job-type", "synthetic.effect",
             "--payload", '{"effect_key":"effect-1","value":7}'],
            ["claim", "--worker-id", "wheel-worker"],
        ]  # fmt: skip
        outputs = []
        for step in steps:
            result = _capture([cli, step[0], "--database", database, *step[1:]], cwd=home)
            outputs.append(json.loads(result.stdout))
            if result.returncode != 0:
                _log(f"{step[0]} failed: {result.stdout}")
                return False
        claimed = outputs[1]["claimed"]
        finish = _capture(
            [cli, "succeed", "--database", database, "--job-id", claimed["job"]["job_id"],
             "--worker-id", "wheel-worker", "--lease-token", claimed["lease_token"]],
            cwd=home,
        )  # fmt: skip
        check = _capture([cli, "check", "--database", database], cwd=home)
        verdict = json.loads(check.stdout)
        state = json.loads(finish.stdout).get("job", {}).get("state")
        ok = finish.returncode == 0 and check.returncode == 0 and verdict["ok"]
        _log(f"wheel round trip: final state {state}, check ok={verdict['ok']}")
        return bool(ok and state == "SUCCEEDED")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--python", default=sys.executable, help="interpreter to test with")
    parser.add_argument("--venv", default=None, help="virtual environment directory")
    parser.add_argument("--pytest-only", action="store_true", help="run only the test suite")
    args = parser.parse_args(argv)
    version = _capture(
        [args.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], cwd=ROOT
    ).stdout.strip()
    venv = (
        Path(args.venv)
        if args.venv
        else ROOT / (".venv" if not args.pytest_only else f".venv-{version}")
    )
    python = _prepare_venv(args.python, venv)
    _log(f"python {version} in {venv}")
    env_note = os.environ.get("CI", "")
    results: list[tuple[str, bool, float]] = []

    def gate(name: str, command: Sequence[str | Path]) -> bool:
        started = time.monotonic()
        ok = _run(command).returncode == 0
        results.append((name, ok, time.monotonic() - started))
        return ok

    if args.pytest_only:
        gate(f"pytest (python {version})", [python, "-m", "pytest", "-q"])
    else:
        gate(
            "pytest + branch coverage >= 95%",
            [python, "-m", "pytest", "-q", "--cov", "--cov-branch", "--cov-report=term-missing"],
        )
        gate("ruff check", [python, "-m", "ruff", "check", "."])
        gate("ruff format --check", [python, "-m", "ruff", "format", "--check", "."])
        gate("mypy --strict", [python, "-m", "mypy"])
        with tempfile.TemporaryDirectory(prefix="crashqueuelab-dist-") as dist:
            if gate("python -m build", [python, "-m", "build", "--outdir", dist, "."]):
                started = time.monotonic()
                ok = _wheel_round_trip(str(python), Path(dist))
                results.append(
                    ("wheel in a clean venv: round trip", ok, time.monotonic() - started)
                )
            else:
                results.append(("wheel in a clean venv: round trip", False, 0.0))
    _log("summary" + (" (CI)" if env_note else ""))
    for name, ok, seconds in results:
        _log(f"  {'PASS' if ok else 'FAIL'}  {name}  ({seconds:.1f} s)")
    failed = [name for name, ok, _ in results if not ok]
    if failed:
        _log(f"{len(failed)} gate(s) failed: {', '.join(failed)}")
        return 1
    _log(f"all {len(results)} gates passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
