"""CPython's own ``test_concurrent_futures`` for the running interpreter, obtained by the
suite itself without changing the system.

Where it is looked for, in order:

1. the interpreter's own stdlib, or the distribution's install of its test suite
   (Debian's ``libpython3.X-testsuite`` puts it in ``/usr/lib/python3.X/test/``);
2. the cache, ``$FLEET_TEST_CACHE`` or ``${XDG_CACHE_HOME:-~/.cache}/fleet-tests``, where
   an earlier run left it;
3. Debian's ``libpython3.X-testsuite`` for this minor version, fetched with ``apt-get
   download`` (from the mirror apt is configured for; with package lists of its own in
   the cache when the system's do not know the package) and unpacked with ``dpkg-deb
   -x`` into the cache. Nothing is installed, and nothing outside the cache is written.

A file found is taken only for the running interpreter's major.minor (the package's
upstream version says which; Debian's bookworm ships 3.11.2's file, which runs against
any 3.11: the executor API it tests did not change within 3.11). The module is written
into the cache under the name `MODULE`, in a folder of its own, so that the fleet's workers
import the functions its tests submit by reference from a directory on ``sys.path``.

`obtain()` returns that directory, or raises `Unavailable` with one line saying why.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

MODULE = "cpython_test_concurrent_futures"
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
PACKAGE = f"libpython{VERSION}-testsuite"
#: Where the file sits inside the package, and where a distribution installs it.
PACKAGED = f"usr/lib/python{VERSION}/test/test_concurrent_futures.py"
INSTALLED = (
    os.path.join(sysconfig.get_paths()["stdlib"], "test", "test_concurrent_futures.py"),
    "/" + PACKAGED,
)
#: The env var that makes a missing file fail the test instead of skipping it (CI sets it).
REQUIRE = "FLEET_REQUIRE_CPYTHON_TESTS"


class Unavailable(Exception):
    """The file cannot be had here; the message is the one line that says why."""


def cache_root() -> Path:
    base = os.environ.get("FLEET_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fleet-tests")
    return Path(base)


def obtain(cache: Path | None = None) -> Path:
    """The directory holding ``MODULE.py`` for this interpreter (see the module docstring)."""
    home = (cache or cache_root()) / f"cpython-{VERSION}"
    home.mkdir(parents=True, exist_ok=True)
    # pytest-xdist's workers all collect the test module at once: one fetches, the others wait.
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        target = home / "module" / (MODULE + ".py")
        target.parent.mkdir(exist_ok=True)
        installed = next((p for p in INSTALLED if os.path.isfile(p)), None)
        if installed is not None:
            _write(target, Path(installed).read_bytes(), f"installed: {installed}")
        elif not target.is_file():
            _write(target, *_from_debian(home))
    return target.parent


def _write(target: Path, content: bytes, source: str) -> None:
    if not (target.is_file() and target.read_bytes() == content):
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(content)
        os.replace(tmp, target)  # a reader never sees half a file
    (target.parent / "SOURCE").write_text(source + "\n")


def _from_debian(home: Path) -> tuple[bytes, str]:
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise Unavailable(f"{PACKAGE} cannot be fetched here: no {tool} (not a Debian-like system)")
    debs = home / "debs"
    debs.mkdir(exist_ok=True)
    deb = _download(debs, home / "apt")
    version = _run(["dpkg-deb", "-f", str(deb), "Version"]).strip()
    upstream = re.match(r"(?:\d+:)?(\d+)\.(\d+)", version)
    if upstream is None or f"{upstream[1]}.{upstream[2]}" != VERSION:
        raise Unavailable(f"{deb.name} is version {version}, not for Python {VERSION}")
    with tempfile.TemporaryDirectory(dir=home) as unpacked:
        _run(["dpkg-deb", "-x", str(deb), unpacked])
        path = Path(unpacked) / PACKAGED
        if not path.is_file():
            raise Unavailable(f"{deb.name} has no {PACKAGED} (a package folder from 3.12 on: "
                              "tests/api/test_cpython_futures.py adapts the single file of 3.11)")
        return path.read_bytes(), f"{deb.name} (Debian {version}) for Python {sys.version.split()[0]}"


def _download(debs: Path, private: Path) -> Path:
    """``apt-get download PACKAGE`` into `debs`: with the system's package lists first,
    then with lists of its own under `private` (a fresh machine's lists may be empty or
    old; updating them there changes nothing of the system's)."""
    found = sorted(debs.glob(f"{PACKAGE}_*.deb"))
    if found:
        return found[-1]
    own_lists = ["-o", f"Dir::State::Lists={private}/lists", "-o", f"Dir::Cache={private}/cache",
                 "-o", "Debug::NoLocking=1"]
    errors = []
    for options in ([], own_lists):
        try:
            if options:
                for sub in ("lists/partial", "cache/archives/partial"):
                    (private / sub).mkdir(parents=True, exist_ok=True)
                _run(["apt-get", "-q", *options, "update"])
            _run(["apt-get", "-q", *options, "download", PACKAGE], cwd=debs)
        except Unavailable as exc:
            errors.append(str(exc))
            continue
        found = sorted(debs.glob(f"{PACKAGE}_*.deb"))
        if found:
            shutil.rmtree(private, ignore_errors=True)  # the lists served once; the .deb is what is kept
            return found[-1]
    raise Unavailable(f"apt-get download {PACKAGE} failed: {errors[-1]}")


def _run(argv: list[str], cwd: Path | None = None) -> str:
    try:
        out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"{argv[0]}: {exc}") from None
    if out.returncode != 0:
        last = (out.stderr.strip() or out.stdout.strip() or f"exit {out.returncode}").splitlines()[-1]
        raise Unavailable(f"{' '.join(argv[:3])}: {last}")
    return out.stdout
