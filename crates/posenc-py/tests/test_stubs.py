"""The type stubs against the package as built: ``mypy.stubtest`` checks
every name, signature and default of ``posenc/_posenc.pyi`` against the
native module (PyO3's text signatures), and mypy type-checks the Python
modules (``posenc``, ``posenc.torch``, ``posenc.hf``) against those stubs,
so an editor's completion and ``help()`` say what the code does.

mypy is not a dependency of the package; these tests skip without it,
except where ``POSENC_REQUIRE_MYPY=1`` (CI installs it and sets that)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

HAVE_MYPY = importlib.util.find_spec("mypy") is not None

pytestmark = pytest.mark.skipif(
    not HAVE_MYPY and os.environ.get("POSENC_REQUIRE_MYPY") != "1",
    reason="mypy is not installed (pip install mypy)",
)


def mypy(tmp_path, *args: str) -> subprocess.CompletedProcess:
    # Run from an empty directory: mypy would otherwise also find the
    # package's sources when the tests run from the repository, and write
    # its cache there.
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_native_module_matches_its_stubs(tmp_path):
    # PEP 800's @disjoint_base is newer than the type checkers the stubs
    # are read by; every other check stays on.
    r = mypy(tmp_path, "mypy.stubtest", "--ignore-disjoint-bases", "posenc._posenc")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_python_modules_type_check_against_the_stubs(tmp_path):
    r = mypy(
        tmp_path, "mypy", "-p", "posenc", "--ignore-missing-imports", "--cache-dir", str(tmp_path / "cache")
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success" in r.stdout, r.stdout
