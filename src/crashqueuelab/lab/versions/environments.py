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

import dataclasses
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

from crashqueuelab.core.errors import InvalidInput, SystemUnavailable
from crashqueuelab.systems.registry import PIN_WITH

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
    """``--system name==version``: a system of the lab at one release of its library, and
    the releases of its dependencies that ``--with`` fixes beside it."""

    system: str
    distribution: str
    version: str
    #: ``--with DIST==VERSION``: (distribution, version), each installed beside the release.
    also: tuple[tuple[str, str], ...] = ()
    #: The library's extras its systems need (Celery's ``redis``: kombu's Redis client;
    #: dramatiq's ``redis`` and ``rabbitmq``: the broker clients it leaves optional).
    extras: tuple[str, ...] = ()

    @property
    def spec(self) -> str:
        return f"{self.system}=={self.version}"

    @property
    def label(self) -> str:
        """The pin and what it fixes beside it: ``celery==5.3.1 with kombu==5.3.1`` (a run
        made with ``--with`` records it as its system, and ``resolve_system`` reads it)."""
        return self.spec + "".join(f"{PIN_WITH}{name}=={version}" for name, version in self.also)

    @property
    def requirement(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        return f"{self.distribution}{extras}=={self.version}"

    @property
    def requirements(self) -> list[str]:
        return [self.requirement, *(f"{name}=={version}" for name, version in self.also)]

    @property
    def distributions(self) -> list[str]:
        """The distributions the pin fixes, the library's first."""
        return [self.distribution, *(name for name, _ in self.also)]


def parse_pin(
    spec: str,
    distribution_of: Callable[[str], str | None],
    extras_of: Callable[[str], tuple[str, ...]] = lambda distribution: (),
) -> Pin | None:
    """The pin ``spec`` asks for; None when it names no version. ``distribution_of`` names
    the distribution of a system that is a released library (None for one that is not),
    ``extras_of`` the extras of that distribution its systems need."""
    if "==" not in spec:
        return None
    system, _, wanted = spec.partition("==")
    if not _VERSION.match(wanted):
        raise InvalidInput("system", f"{wanted!r} is not a release number such as 3.2.1")
    distribution = distribution_of(system)
    if distribution is None:
        raise SystemUnavailable(
            spec,
            "only a released library can be pinned: a shipped one, or a system whose"
            " `distribution` names it on the package index",
        )
    return Pin(system, distribution, wanted, extras=extras_of(distribution))


def parse_label(
    spec: str,
    distribution_of: Callable[[str], str | None],
    extras_of: Callable[[str], tuple[str, ...]] = lambda distribution: (),
) -> Pin | None:
    """The pin a run's spec names, with what ``--with`` fixed beside it where the spec is a
    ``Pin.label`` (``celery==5.3.1 with kombu==5.3.1``); None when it names no version."""
    pinned, *fixed = spec.split(PIN_WITH)
    return parse_with(fixed, parse_pin(pinned, distribution_of, extras_of))


def parse_with(texts: Sequence[str], pin: Pin | None) -> Pin | None:
    """``pin`` with the dependencies ``--with DIST==VERSION`` fixes beside it (each text
    one of them); an error of one line for anything else."""
    if not texts:
        return pin
    if pin is None:
        raise InvalidInput(
            "with",
            "--with fixes a dependency of a pinned release: pin the system too, as in"
            " --system celery==5.3.1 --with kombu==5.3.1",
        )
    also: list[tuple[str, str]] = []
    for text in texts:
        name, equals, wanted = text.partition("==")
        found = _REQUIREMENT_NAME.match(name)
        if not equals or found is None or found.group(0) != name:
            raise InvalidInput("with", f"{text!r} is not DISTRIBUTION==VERSION, as kombu==5.3.1")
        if not _VERSION.match(wanted):
            raise InvalidInput("with", f"{wanted!r} is not a release number such as 5.3.1")
        key = _canonical(name)
        if key == _canonical(pin.distribution):
            raise InvalidInput(
                "with", f"{name} is the pinned library itself: its release is --system's"
            )
        if key in (_canonical(each) for each, _ in also):
            raise InvalidInput("with", f"{name} is named twice")
        also.append((name, wanted))
    return dataclasses.replace(pin, also=tuple(also))


def _canonical(name: str) -> str:
    """A distribution's name as the package index compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


#: Beside the environments: links to the user adapters pinned runs carry.
ADAPTER_CODE = ".adapter-code"


def adapter_code(pin: Pin) -> Path | None:
    """For a ``module:factory`` system, a directory holding only a link to the adapter's
    top-level module or package, to put on the pinned run's path after the lab's code: the
    adapter runs there as it does here, and nothing else of this process's path comes with
    it (a checkout of the library beside the adapter would hide the pinned release). None
    for a shipped system, and for an adapter that is part of the pinned library itself,
    which comes with its release."""
    module, colon, _ = pin.system.partition(":")
    if not colon:
        return None
    top = module.split(".")[0]
    if pin.distribution.lower() in (name.lower() for name in packages_distributions().get(top, ())):
        return None
    spec = importlib.util.find_spec(top)
    if spec is None or (spec.origin is None and not spec.submodule_search_locations):
        raise SystemUnavailable(pin.spec, f"the adapter's module {top} cannot be found")
    if spec.submodule_search_locations:
        source = Path(next(iter(spec.submodule_search_locations))).resolve()
    else:
        assert spec.origin is not None
        source = Path(spec.origin).resolve()
    where = hashlib.sha256(str(source).encode()).hexdigest()[:10]
    directory = cache_root() / ADAPTER_CODE / where
    if (directory / source.name).exists():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    making = Path(tempfile.mkdtemp(prefix=f".{where}.", dir=directory.parent))
    (making / source.name).symlink_to(source)
    try:
        making.rename(directory)
    except OSError:  # another run made it meanwhile
        shutil.rmtree(making, ignore_errors=True)
    return directory


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


def companions(pin: Pin) -> tuple[str, ...]:
    """What the library's declaration installs beside the pinned release
    (``Library.companions``)."""
    from crashqueuelab.systems.registry import companions_of

    return companions_of(pin.system, pin.version)


def environment_name(pin: Pin) -> str:
    """The release, and the Python it runs on: the base interpreter (a virtual environment
    built from this one is built on it), its version, and the lab's dependencies installed
    beside the release. Not the lab's checkout: its code is put on the path at run time."""
    minor = f"{sys.version_info.major}{sys.version_info.minor}"
    python = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    built_on = "\n".join(
        [str(python), sys.version, *pin.requirements, *lab_requirements(), *companions(pin)]
    )
    digest = hashlib.sha256(built_on.encode()).hexdigest()[:10]
    fixed = "".join(f"+{name}-{version}" for name, version in pin.also)
    return f"{pin.distribution}-{pin.version}{fixed}-py{minor}-{digest}"


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
    own path, this lab's code and a user's adapter (``adapter_code``), nothing else of this
    environment."""
    carried = [lab_code(), adapter_code(pin)]
    path = os.pathsep.join(str(entry) for entry in carried if entry is not None)
    return dict(os.environ, **{PINNED_VARIABLE: pin.label, "PYTHONPATH": path})


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


#: Beside the environments: pip's whole output of each install that failed, one file per
#: environment it was building (the next failure of the same one replaces it).
PIP_LOGS = ".pip-logs"
#: pip's refusal of a release it cannot find, listing the releases the index has.
_NOT_FOUND = re.compile(r"requirement (\S+) \(from versions: ([^)]*)\)")
#: A refusal names this many of the newest releases.
NEWEST_NAMED = 4


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(number) for number in re.findall(r"[0-9]+", release))


def _releases_text(pin: Pin, asked: str, listed: str) -> str:
    """What the index has, in a few words: how many releases, the first and the last, and
    the two either side of the one asked for (or, past them all, the newest). ``asked`` is
    the requirement pip refused: the library's, or one ``--with`` fixes."""
    name, version = pin.distribution, pin.version
    for each, wanted_there in pin.also:
        if _canonical(asked.partition("==")[0]) == _canonical(each):
            name, version = each, wanted_there
    releases = [release.strip() for release in listed.split(",") if release.strip()]
    missing = f"the index has no release {version} of {name}"
    if not releases or releases == ["none"]:
        return f"{missing}, nor any other"
    wanted = _release_key(version)
    below = [r for r in releases if _release_key(r) < wanted]
    above = [r for r in releases if _release_key(r) > wanted]
    around = (
        f"the nearest {max(below, key=_release_key)} and {min(above, key=_release_key)}"
        if below and above
        else f"the newest {', '.join(releases[-NEWEST_NAMED:])}"
    )
    return f"{missing}; it has {len(releases)}, {releases[0]} to {releases[-1]}, {around}"


def _refusal(pin: Pin, installed: subprocess.CompletedProcess[str], log: Path) -> str:
    """pip's failure as one short line, its whole output kept in ``log``: which release is
    missing and which the index has, or else pip's last error."""
    output = (installed.stdout or "") + (installed.stderr or "")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(output, encoding="utf-8")
    found = _NOT_FOUND.search(output)
    errors = [line.strip() for line in output.splitlines() if line.strip()]
    said = (
        _releases_text(pin, found.group(1), found.group(2))
        if found
        else next((line for line in reversed(errors) if line.startswith("ERROR")), None)
        or (errors[-1] if errors else f"pip exited {installed.returncode}, saying nothing")
    )
    if len(said) > ERROR_LINE:
        said = said[: ERROR_LINE - 1] + "…"
    return f"pip could not install {' '.join(pin.requirements)}: {said}; pip's output: {log}"


#: pip's last error, in a refusal, is cut to this many characters (the file has it all).
ERROR_LINE = 200


def _build(pin: Pin, directory: Path, log: Path) -> dict[str, Any]:
    venv.EnvBuilder(with_pip=True, symlinks=True, clear=True).create(directory)
    beside = companions(pin)
    installed = _pip(
        directory, "install", "--quiet", *pin.requirements, *beside, *lab_requirements()
    )
    if installed.returncode != 0:
        raise SystemUnavailable(pin.spec, _refusal(pin, installed, log))
    frozen = _pip(directory, "list", "--format", "json")
    packages = {row["name"].lower(): row["version"] for row in json.loads(frozen.stdout or "[]")}
    return {
        "pin": pin.label,
        "requirement": pin.requirement,
        "with": [f"{name}=={version}" for name, version in pin.also],
        "companions": list(beside),
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
            marker = _build(pin, building, root / PIP_LOGS / f"{directory.name}.log")
            (building / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True))
            shutil.rmtree(directory, ignore_errors=True)
            building.rename(directory)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return directory, marker
