"""Shared paths and fixtures of the pytest suite.

The suite runs against the installed package (``pip install
./crates/posenc-py``); it reads the same fixture files as the Rust tests.
"""

import json
import os
import pathlib
import shutil
import signal
import threading

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = REPO / "crates" / "posenc" / "tests" / "fixtures"
METHOD_FIXTURES = REPO / "crates" / "posenc-models" / "tests" / "fixtures" / "methods"


@pytest.fixture(autouse=True)
def _sigint_raises_keyboard_interrupt():
    """Python's own SIGINT handler during each test.

    A runner started in the background by a script (``cmd &`` without job
    control) starts Python with SIGINT ignored, and Python then installs no
    handler: the Ctrl-C tests' signal would be dropped and the call they
    interrupt would run to its end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


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
