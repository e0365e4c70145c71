"""A library pinned to one release, in a virtual environment of its own: ``--system huey==3.2.1``.

The lab installs the release from the package index into a cached virtual environment, with
the lab's optional dependencies at the versions already installed here. The whole command
then runs again in that environment, with the lab's own code on its path (a directory of
links to the very packages that are running, so the pinned run is this lab and no other
copy): crash children, workers, readers and the page all see that release and no other. The
report names the versions that were installed, read back from the environment.

Environments are kept under ``$CRASHQUEUELAB_CACHE`` (default ``$XDG_CACHE_HOME`` or
``~/.cache``, then ``crashqueuelab/environments``), one per library release and Python (the
interpreter and the lab's dependencies it was built with), whichever checkout of the lab
uses it; building one is locked, so two runs never build the same one twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import venv
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, requires
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import InvalidInput, SystemUnavailable

CACHE_VARIABLE = "CRASHQUEUELAB_CACHE"
#: Set in a pinned run's environment: the ``name==version`` it was started for.
PINNED_VARIABLE = "CRASHQUEUELAB_PINNED"
#: The file a finished environment holds: what was asked and what was installed.
MARKER = "crashqueuelab-environment.json"
#: The lab's extras whose dependencies a pinned run may need (pages, the power-loss disk,
#: the PostgreSQL client for the libraries on a server and their judges, and pytest: the
#: run tries the reproducers it exports, and they run in the release's environment).
LAB_EXTRAS = ("reports", "powerloss", "postgres", "pytest")
#: pip may download and build; bounded all the same.
INSTALL_TIMEOUT_S = 900.0
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$")
_REQUIREMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class Pin:
    """``--system name==version``: a system of the lab at one release of its library."""

    system: str
    distribution: str
    version: str

    @property
    def spec(self) -> str:
        return f"{self.system}=={self.version}"

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


def parse_pin(spec: str, distributions: dict[str, str]) -> Pin | None:
    """The pin ``spec`` asks for; None when it names no version. ``distributions`` maps
    the systems that are released libraries to their distribution names."""
    if "==" not in spec:
        return None
    system, _, wanted = spec.partition("==")
    if system not in distributions:
        known = ", ".join(sorted(distributions))
        raise SystemUnavailable(spec, f"only a released library can be pinned: one of {known}")
    if not _VERSION.match(wanted):
        raise InvalidInput("system", f"{wanted!r} is not a release number such as 3.2.1")
    return Pin(system, distributions[system], wanted)


def cache_root() -> Path:
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "crashqueuelab" / "environments"


#: The top-level packages of the lab's distribution, linked into every environment.
LAB_PACKAGES = ("crashqueuelab", "walqueue")


def lab_package(name: str = "crashqueuelab") -> Path:
    """The directory of one of the lab's packages, as this process imports it."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:  # pragma: no cover - the lab's own packages
        raise SystemUnavailable(name, "the lab's own package cannot be found")
    return Path(spec.origin).resolve().parent


def lab_requirements() -> list[str]:
    """The lab's optional dependencies that are installed here, at the installed versions."""
    try:
        declared = requires("crashqueuelab") or []
    except PackageNotFoundError:  # pragma: no cover - the lab runs from a checkout
        return []
    pinned = []
    for line in declared:
        requirement, _, marker = line.partition(";")
        if not any(f'extra == "{extra}"' in marker for extra in LAB_EXTRAS):
            continue
        found = _REQUIREMENT_NAME.match(requirement.strip())
        if found is None:  # pragma: no cover - the lab's own metadata
            continue
        name = found.group(0)
        try:
            pinned.append(f"{name}=={installed_version(name)}")
        except PackageNotFoundError:
            continue
    return sorted(pinned)


def environment_name(pin: Pin) -> str:
    """The release, and the Python it runs on: the base interpreter (a virtual environment
    built from this one is built on it), its version, and the lab's dependencies installed
    beside the release. Not the lab's checkout: its code is put on the path at run time."""
    minor = f"{sys.version_info.major}{sys.version_info.minor}"
    python = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    built_on = "\n".join([str(python), sys.version, *lab_requirements()])
    digest = hashlib.sha256(built_on.encode()).hexdigest()[:10]
    return f"{pin.distribution}-{pin.version}-py{minor}-{digest}"


#: Beside the environments: one directory of links to the lab's packages per checkout.
LAB_CODE = ".lab-code"


def lab_code() -> Path:
    """A directory holding only links to the running lab's packages (made on first use), to
    put on a pinned run's path: nothing else of this environment comes with them."""
    packages = [lab_package(name) for name in LAB_PACKAGES]
    where = hashlib.sha256("\n".join(map(str, packages)).encode()).hexdigest()[:10]
    directory = cache_root() / LAB_CODE / where
    if all((directory / name).exists() for name in LAB_PACKAGES):
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    making = Path(tempfile.mkdtemp(prefix=f".{where}.", dir=directory.parent))
    for name, package in zip(LAB_PACKAGES, packages, strict=True):
        (making / name).symlink_to(package)
    try:
        making.rename(directory)
    except OSError:  # another run made it meanwhile
        shutil.rmtree(making, ignore_errors=True)
    return directory


def python_of(directory: Path) -> Path:
    return directory / "bin" / "python"


def pinned_environment(pin: Pin) -> dict[str, str]:
    """The environment variables of a process run in ``pin``'s environment: the release's
    own path and this lab's code, nothing else of this environment."""
    return dict(os.environ, **{PINNED_VARIABLE: pin.spec, "PYTHONPATH": str(lab_code())})


def read_marker(directory: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and python_of(directory).exists() else None


def _pip(directory: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    command = [str(python_of(directory)), "-m", "pip", "--disable-pip-version-check", *arguments]
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, 1, "", f"pip ran past {INSTALL_TIMEOUT_S} s")


def _build(pin: Pin, directory: Path) -> dict[str, Any]:
    venv.EnvBuilder(with_pip=True, symlinks=True, clear=True).create(directory)
    installed = _pip(directory, "install", "--quiet", pin.requirement, *lab_requirements())
    if installed.returncode != 0:
        tail = " ".join((installed.stderr or installed.stdout).strip().splitlines()[-3:])
        raise SystemUnavailable(pin.spec, f"pip could not install {pin.requirement}: {tail}")
    frozen = _pip(directory, "list", "--format", "json")
    packages = {row["name"].lower(): row["version"] for row in json.loads(frozen.stdout or "[]")}
    return {
        "pin": pin.spec,
        "requirement": pin.requirement,
        "installed": packages,
        "python": sys.version.split()[0],
    }


def ensure_environment(pin: Pin) -> tuple[Path, dict[str, Any]]:
    """The pinned release's environment, built on first use; its directory and marker."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    directory = root / environment_name(pin)
    marker = read_marker(directory)
    if marker is not None:
        return directory, marker
    with (root / f".{directory.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = read_marker(directory)
        if marker is not None:  # another run built it while this one waited
            return directory, marker
        building = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=root))
        try:
            marker = _build(pin, building)
            (building / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True))
            shutil.rmtree(directory, ignore_errors=True)
            building.rename(directory)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return directory, marker
