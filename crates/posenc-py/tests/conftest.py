"""Shared paths and fixtures of the pytest suite.

The suite runs against the installed package (``pip install
./crates/posenc-py``); it reads the same fixture files as the Rust tests.
"""

import json
import os
import pathlib
import shutil

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = REPO / "crates" / "posenc" / "tests" / "fixtures"
METHOD_FIXTURES = REPO / "crates" / "posenc-models" / "tests" / "fixtures" / "methods"


def load(path):
    with open(path) as f:
        return json.load(f)


def posenc_binary():
    """The built `posenc` binary (release first), or None."""
    for sub in ("release", "debug"):
        p = REPO / "target" / sub / "posenc"
        if p.exists():
            return p
    found = shutil.which("posenc")
    return pathlib.Path(found) if found else None


@pytest.fixture(scope="session")
def cli():
    b = posenc_binary()
    if b is None:
        if os.environ.get("POSENC_REQUIRE_CLI"):
            pytest.fail("no posenc binary under target/ (cargo build -p posenc-cli)")
        pytest.skip("no posenc binary under target/ (cargo build -p posenc-cli)")
    return b
