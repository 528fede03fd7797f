"""Fixtures shared by the tests of ranks on real processes."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from external import keys_for, stop_all


@pytest.fixture
def keys(tmp_path) -> Path:
    """CURVE keys for a scheduler and 4 ranks, in a fresh directory."""
    return keys_for(tmp_path)


@pytest.fixture
def procs():
    """Processes a test starts; whatever still runs at the end is killed (and must die)."""
    started: list[subprocess.Popen] = []
    yield started
    stop_all(started)
