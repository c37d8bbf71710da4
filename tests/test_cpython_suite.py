"""tests.cpython_suite takes CPython's test file only from a package for the running
interpreter's minor version, and only as the single file the adapter reads."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests import cpython_suite


def _deb(debs, version: str, files: dict[str, str]):
    """A .deb named as Debian's package, holding `files`, of `version`."""
    root = debs.parent / f"build-{version}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {cpython_suite.PACKAGE}\nVersion: {version}\nArchitecture: all\n"
        "Maintainer: nobody <nobody@localhost>\nDescription: test\n")
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    debs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "-b", str(root), str(debs / f"{cpython_suite.PACKAGE}_{version}_all.deb")],
                   check=True, capture_output=True)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(cpython_suite, "INSTALLED", ())  # not the machine's: only the cache's package
    return tmp_path / "cache"


def test_a_package_of_this_minor_version_is_unpacked_into_the_cache(cache):
    _deb(cache / f"cpython-{cpython_suite.VERSION}" / "debs", f"{cpython_suite.VERSION}.2-6+deb12u9",
         {cpython_suite.PACKAGED: "MARK = 1\n"})
    folder = cpython_suite.obtain(cache)
    assert (folder / f"{cpython_suite.MODULE}.py").read_text() == "MARK = 1\n"
    assert sorted(p.name for p in folder.iterdir()) == ["SOURCE", f"{cpython_suite.MODULE}.py"]


def test_a_package_of_another_minor_version_is_refused(cache):
    other = f"{sys.version_info.major}.{sys.version_info.minor + 1}"
    _deb(cache / f"cpython-{cpython_suite.VERSION}" / "debs", f"{other}.0-1", {cpython_suite.PACKAGED: "MARK = 1\n"})
    with pytest.raises(cpython_suite.Unavailable, match=f"not for Python {cpython_suite.VERSION}"):
        cpython_suite.obtain(cache)


def test_a_package_without_the_single_file_is_refused(cache):
    _deb(cache / f"cpython-{cpython_suite.VERSION}" / "debs", f"{cpython_suite.VERSION}.2-1",
         {cpython_suite.PACKAGED.replace(".py", "/__init__.py"): ""})
    with pytest.raises(cpython_suite.Unavailable, match="has no"):
        cpython_suite.obtain(cache)


def test_without_apt_it_says_so_in_one_line(cache, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(cpython_suite.Unavailable) as caught:
        cpython_suite.obtain(cache)
    assert "no apt-get" in str(caught.value) and "\n" not in str(caught.value)
