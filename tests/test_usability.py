"""The command line as a first-time user meets it: a workload written from the README alone,
a big run that stays readable, a long run that shows it is alive (only on a terminal), a `compare`
that can break things and says which side failed, the small things (--version, --help)."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
from pathlib import Path

import pytest

from tests.helpers.external import CLI, ENV, REPO, cli, serving_spec

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]

WORKLOAD_PAGE = (REPO / "docs" / "cli.md").read_text()     # its "### The workload format"



@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """A 300-request serving workload."""
    return serving_spec(tmp_path_factory.mktemp("big") / "serving300.json", 300)


# -- 1. the workload format ----------------------------------------------------------------------

def test_the_readme_example_workload_runs(tmp_path):
    example = re.search(r"### The workload format.*?```json\n(.*?)```", WORKLOAD_PAGE, re.S).group(1)
    spec = tmp_path / "w.json"
    spec.write_text(example)
    assert cli("run", "--spec", spec).returncode == 0
    done = cli("launch", "--spec", spec, "--json")                   # its fault, acted out
    assert done.returncode == 1 and '"RankLost"' in done.stdout.splitlines()[-1]


def test_every_key_of_the_engine_is_documented_in_the_readme_and_in_run_help():
    from inferris_dist.engine.workload import ENGINE_KEYS, REQUEST_KEYS, TOP_KEYS
    table = WORKLOAD_PAGE.split("### The workload format", 1)[1].split("\n\n## ", 1)[0]
    helptext = cli("run", "--help").stdout
    for key in (*ENGINE_KEYS, *REQUEST_KEYS, "faults"):
        assert f"`{key}`" in table, key
        assert key in helptext, key
    assert set(TOP_KEYS) == {"engine", "requests", "faults"}
    from inferris_dist.protocol.faults import KINDS
    assert all(kind in helptext for kind in KINDS)


@pytest.mark.parametrize("request_,words", [
    ({"id": "a", "prompt_len": 3, "max_new_tokens": 2},
     "unknown key 'id' in request 0; did you mean 'request_id'?"),
    ({"request_id": "a", "prompt_len": 3, "max_new": 2},
     "unknown key 'max_new' in request 0; did you mean 'max_new_tokens'?"),
    ({"request_id": "a", "promt_len": 3, "max_new_tokens": 2}, "did you mean 'prompt_len'?"),
])
def test_an_unknown_key_names_the_closest_known_one(tmp_path, request_, words):
    spec = tmp_path / "w.json"
    spec.write_text(json.dumps({"requests": [request_]}))
    done = cli("run", "--spec", spec)
    assert done.returncode == 2 and words in done.stderr and done.stderr.count("\n") == 1, done.stderr


# -- 2. big runs ---------------------------------------------------------------------------------

def test_a_big_run_keeps_each_step_to_one_short_line(big):
    done = cli("run", "--spec", big)
    assert done.returncode == 0
    steps = [line for line in done.stdout.splitlines() if re.match(r"^\s*\d+(-\d+)?  ", line)]
    assert steps and max(map(len, steps)) <= 110, max(steps, key=len)
    assert any(" more" in line or re.search(r"run \d+ \(\d+ tok\)", line) for line in steps)
    verbose = cli("run", "--spec", big, "--verbose")
    assert max(map(len, verbose.stdout.splitlines())) > 500          # every request named
    assert cli("run", "--spec", big, "--json").stdout == cli("run", "--spec", big, "--json",
                                                              "--verbose").stdout


def test_small_runs_are_unchanged_by_the_summary():
    done = cli("run", "--request", "a:10:3", "--request", "b:6:2:1", "--max-step-tokens", "6",
               "--num-pages", "6")
    assert "    1  admit b  run a:4 b:2  publish a:1  sample a" in done.stdout


# -- 3. a sign of life ---------------------------------------------------------------------------

def run_with_a_terminal_for_stderr(args) -> tuple[int, bytes, str]:
    master, slave = pty.openpty()
    with open(os.devnull, "w") as out:
        proc = subprocess.Popen([*CLI, *map(str, args)], env=ENV, stdout=out, stderr=slave,
                                stdin=subprocess.DEVNULL)
    os.close(slave)
    got = b""
    while True:
        ready, _, _ = select.select([master], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:                              # the child closed its end
            break
        if not chunk:
            break
        got += chunk
    os.close(master)
    return proc.wait(30), got, ""


@pytest.mark.parametrize("command,steps", [("run", 30000), ("launch", 3000)])
def test_progress_shows_on_a_terminal_and_is_erased(tmp_path, command, steps):
    spec = tmp_path / "long.json"                     # long enough to outlast a redraw or two
    spec.write_text(json.dumps({"engine": {"max_step_tokens": 2, "page_size": 1024, "num_pages": 64},
                                "requests": [{"request_id": "q", "prompt_len": 4, "max_new_tokens": steps}]}))
    status, err, _ = run_with_a_terminal_for_stderr([command, "--spec", spec, "--json"])
    assert status == 0
    assert b"finished" in err and b"steps/s" in err, err[-200:]
    assert err.endswith(b"\r\x1b[K")                  # gone when the run ends
    if command == "launch":
        assert b"rtt" in err


def test_no_progress_when_stderr_is_not_a_terminal(tmp_path):
    spec = tmp_path / "long.json"
    spec.write_text(json.dumps({"engine": {"max_step_tokens": 2, "page_size": 64, "num_pages": 64},
                                "requests": [{"request_id": "q", "prompt_len": 4, "max_new_tokens": 3000}]}))
    done = cli("run", "--spec", spec, "--json")
    assert done.returncode == 0 and done.stderr == ""
    assert "steps/s" not in done.stdout


# -- 4. compare can break things -----------------------------------------------------------------

def test_compare_with_a_fault_names_the_side_kind_step_and_rank():
    done = cli("compare", "--fault", "1:crash@2")
    assert done.returncode == 1
    assert "demo: the run on processes failed: RankLost at step 2, epoch 0, rank 1" in done.stdout
    assert "'admitted'" not in done.stdout                          # no field diff for a failure
    survived = cli("compare", "--fault", "1:crash@2", "--on-rank-loss", "restore")
    assert survived.returncode == 0 and "identical (6 steps)" in survived.stdout


def test_compare_says_when_both_sides_end_alike():
    done = cli("compare", "--spec", REPO / "tests" / "data" / "golden" / "irreducible.spec.json")
    assert done.returncode == 0 and "both ending Irreducible at step" in done.stdout


# -- 6. small things -----------------------------------------------------------------------------

def test_version_and_help():
    version = cli("--version")
    assert version.returncode == 0 and re.fullmatch(r"inferris-dist \S+\n", version.stdout)
    helptext = cli("--help").stdout
    for command in ("run", "demo", "launch", "compare", "inspect", "ladder", "mechs", "keys", "worker"):
        assert re.search(rf"^\s+{command}\s+\S", helptext, re.M), command


@pytest.mark.parametrize("args,path", [(("run", "--spec", "/no/such/w.json"), "/no/such/w.json"),
                                       (("launch", "--wire-log", "/no/such/dir/w.log"), "/no/such/dir/w.log"),
                                       (("inspect", "/no/such/wire.log"), "/no/such/wire.log")])
def test_an_error_about_a_file_names_the_file(args, path):
    done = cli(*args)
    assert done.returncode == 2 and path in done.stderr and done.stderr.count("\n") == 1, done.stderr
