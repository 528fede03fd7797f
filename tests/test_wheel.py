"""The package stands on its own once installed: its wheel holds one top-level name of ours,
`inferris_dist` (the engine, the launcher, the mechanism notes and the page's files inside it),
and it runs from that wheel outside the checkout: a launch on worker processes, a mechanism
note, and the page of a run."""
from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from tests.helpers.external import ENV

pytestmark = [pytest.mark.timeout(180), pytest.mark.procs]


@pytest.fixture(scope="module")
def wheel(wheel_file) -> zipfile.ZipFile:
    return zipfile.ZipFile(wheel_file)


def test_the_wheel_installs_one_name_of_ours_with_the_notes_inside(wheel):
    names = wheel.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"inferris_dist"}, tops
    assert "inferris_dist/engine/step.py" in names and "inferris_dist/launcher/template.py" in names
    assert "inferris_dist/notes/11-executor-boundary.md" in names
    assert {f"inferris_dist/page/page.{ext}" for ext in ("html", "css", "js")} <= set(names)
    assert not any("/tests/" in n or n.startswith("tests/") for n in names)


def test_it_runs_from_the_wheel_outside_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    wheel.extractall(site)
    env = {**ENV, "PYTHONPATH": str(site)}
    cli = [sys.executable, "-m", "inferris_dist.cli"]
    where = subprocess.run([sys.executable, "-c", "import inferris_dist; print(inferris_dist.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr      # not the checkout
    note = subprocess.run([*cli, "mechs", "11"], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=30)
    assert note.returncode == 0 and note.stdout.startswith("# 11. Executor boundary"), note.stderr
    run = subprocess.run([*cli, "launch", "--world-size", "2"], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "3/3 requests finished" in run.stdout and "none left running" in run.stdout


def test_the_page_is_built_from_the_wheel(wheel, tmp_path):
    """The page's markup, style and script are package data: read from the installed package."""
    site = tmp_path / "site"
    wheel.extractall(site)
    env = {**ENV, "PYTHONPATH": str(site)}
    run = subprocess.run([sys.executable, "-m", "inferris_dist.cli", "launch", "--world-size", "2",
                          "--html", "run.html"], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    page = (tmp_path / "run.html").read_text()
    assert "Content-Security-Policy" in page and "window.inferrisPage" in page and "@SCRIPT@" not in page
