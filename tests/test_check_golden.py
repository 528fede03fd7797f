"""tools/check_golden.py: the golden checker finds real differences, and only those.

Each test builds a tiny golden directory in tmp_path and checks a fake engine
against it: a script that prints the golden trace beside the workload it is
given (or the ladder trace of the rung it is given), spoiled in one way the
test chooses. The real goldens are run by hand (see the script's docstring),
not here.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.external import REPO

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]

SCRIPT = REPO / "tools" / "check_golden.py"

# tools/ is not a package: load the script as a module (registered first, for its dataclass)
_spec = importlib.util.spec_from_file_location("check_golden", SCRIPT)
check_golden = sys.modules.setdefault("check_golden", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(check_golden)

FAKE = '''\
import json, sys, time
from pathlib import Path

args = sys.argv[1:]
mode = args.pop(0)
rung = None
if args[0] == "--rung":
    rung, args = args[1], args[2:]
spec = Path(args[0])
case = spec.name[:-len(".spec.json")]
if mode == "ignore-rung":
    rung = rung and "00"
trace = (spec.parent / "ladder" / f"{case}.{rung}.trace.jsonl" if rung
         else spec.with_name(case + ".trace.jsonl"))
objs = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
failed = "error" in objs[-1]
steps = [o for o in objs if "step" in o and "error" not in o]
if mode == "wrong":
    steps[-1]["executed"] = {"x": 99}
elif mode == "message" and failed:
    objs[-1]["message"] = "said differently"
    objs[-1]["rank"] = 3
elif mode == "error-step" and failed:
    objs[-1]["step"] += 1
elif mode == "short":
    objs.pop()
elif mode == "key-order":
    first = objs[0]
    objs[0] = {"admitted": first.pop("admitted"), **first}
elif mode == "map-order":
    objs[0]["executed"] = dict(reversed(objs[0]["executed"].items()))
elif mode == "garbage":
    print("Traceback (most recent call last):")
elif mode == "sleep":
    time.sleep(30)
for o in objs:
    print(json.dumps(o))
print("", flush=True)
print("a line on stderr", file=sys.stderr)
sys.exit(0 if mode == "exit-0" else 1 if failed else 0)
'''

A_TRACE = [
    {"step": 0, "admitted": ["p", "q"], "scheduled": ["p", "q"], "executed": {"p": 4, "q": 2},
     "sampled": {"q": "TOKEN"}, "finished": {}},
    {"step": 1, "admitted": [], "scheduled": ["p", "q"], "executed": {"p": 1, "q": 1},
     "sampled": {"p": "TOKEN", "q": "TOKEN"}, "finished": {"p": "LENGTH", "q": "LENGTH"}},
    {"summary": [{"request_id": "p", "state": "FINISHED", "generated": 1, "computed": 5,
                  "finish_reason": "LENGTH"}]},
]
B_TRACE = [
    {"step": 0, "admitted": ["big"], "scheduled": ["big"], "executed": {"big": 8}, "sampled": {},
     "finished": {}},
    {"error": "Irreducible", "message": "big alone outgrows the pool", "step": 1},
]


def write_trace(path: Path, objs: list[dict]) -> None:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))


@pytest.fixture
def golden(tmp_path) -> Path:
    """Two workloads (one ending in an error) and three ladder traces."""
    root = tmp_path / "golden"
    (root / "ladder").mkdir(parents=True)
    for case, trace in (("a", A_TRACE), ("b", B_TRACE)):
        (root / f"{case}.spec.json").write_text("{}\n")
        write_trace(root / f"{case}.trace.jsonl", trace)
    write_trace(root / "ladder" / "a.00.trace.jsonl", A_TRACE[1:])
    write_trace(root / "ladder" / "a.08a.trace.jsonl", [{**A_TRACE[0], "preempted": []}, A_TRACE[2]])
    write_trace(root / "ladder" / "b.00.trace.jsonl", B_TRACE)
    (root / "ladder" / "README.md").write_text("not a trace\n")
    return root


@pytest.fixture
def fake(tmp_path) -> list[str]:
    path = tmp_path / "fake_engine.py"
    path.write_text(FAKE)
    return [sys.executable, str(path)]


def check(capsys, *argv) -> tuple[int, str, str]:
    """check_golden's main in this process: (exit status, stdout, stderr)."""
    try:
        status = check_golden.main([str(a) for a in argv])
    except SystemExit as e:          # argparse's usage errors
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


def fails(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("FAIL ")]


def test_passes_when_every_trace_agrees(capsys, golden, fake):
    status, out, _ = check(capsys, "--golden", golden, "--", *fake, "right", "{}")
    assert status == 0, out
    assert out.splitlines() == ["2 passed, 0 failed"]


def test_finds_a_wrong_line_and_says_which(capsys, golden, fake):
    status, out, _ = check(capsys, "--golden", golden, "--", *fake, "wrong", "{}")
    assert status == 1
    first, second = fails(out)
    assert first.startswith("FAIL a: line 2 differs in executed: got ")
    assert '"executed": {"x": 99}' in first and '"executed": {"p": 1, "q": 1}' in first
    assert second.startswith("FAIL b: line 1 differs in executed: ")
    assert out.splitlines()[-1] == "0 passed, 2 failed"


def test_an_error_line_is_compared_by_kind_and_step_only(capsys, golden, fake):
    status, out, _ = check(capsys, "--golden", golden, "--", *fake, "message", "{}")
    assert status == 0, out
    status, out, _ = check(capsys, "--golden", golden, "--", *fake, "error-step", "{}")
    assert status == 1
    assert fails(out) == [
        'FAIL b: line 2 differs in step: got {"error": "Irreducible", "step": 2} '
        'want {"error": "Irreducible", "step": 1}']


def test_the_exit_status_must_match_how_the_run_ended(capsys, golden, fake):
    status, out, _ = check(capsys, "--golden", golden, "--", *fake, "exit-0", "{}")
    assert status == 1
    assert fails(out) == ["FAIL b: exit status 0, want 1 (stderr: a line on stderr)"]
    assert out.splitlines()[-1] == "1 passed, 1 failed"


def test_missing_lines_garbage_and_order_are_differences(capsys, golden, fake):
    _, out, _ = check(capsys, "--golden", golden, "--only", "a", "--", *fake, "short", "{}")
    assert fails(out)[0].startswith('FAIL a: got 2 lines, want 3; first missing: {"summary"')
    _, out, _ = check(capsys, "--golden", golden, "--only", "a", "--", *fake, "garbage", "{}")
    assert fails(out)[0].startswith("FAIL a: output line 1 is not JSON")
    _, out, _ = check(capsys, "--golden", golden, "--only", "a", "--", *fake, "key-order", "{}")
    assert fails(out)[0].startswith("FAIL a: line 1 differs in key order: ")
    _, out, _ = check(capsys, "--golden", golden, "--only", "a", "--", *fake, "map-order", "{}")
    assert fails(out)[0].startswith("FAIL a: line 1 differs in executed: ")


def test_a_command_that_does_not_answer_is_stopped(capsys, golden, fake):
    status, out, _ = check(capsys, "--golden", golden, "--only", "a", "--timeout", "0.5",
                           "--", *fake, "sleep", "{}")
    assert status == 1
    assert fails(out) == ["FAIL a: no answer in 0.5 s"]


def test_jobs_change_nothing_but_the_time(capsys, golden, fake):
    one = check(capsys, "--golden", golden, "--", *fake, "wrong", "{}")
    two = check(capsys, "--golden", golden, "-j", "2", "--", *fake, "wrong", "{}")
    assert one == two


def test_the_ladder_substitutes_each_rung(capsys, golden, fake):
    cmd = [*fake, "right", "--rung", "{rung}", "{}"]
    status, out, _ = check(capsys, "--golden", golden, "--ladder", "--", *cmd)
    assert status == 0, out
    assert out.splitlines() == ["3 passed, 0 failed"]
    # the same command stuck at rung 00 fails exactly the 08a trace
    status, out, _ = check(capsys, "--golden", golden, "--ladder", "--", *fake, "ignore-rung",
                           "--rung", "{rung}", "{}")
    assert status == 1
    assert [line.split(":")[0] for line in fails(out)] == ["FAIL a at rung 08a"]
    status, out, _ = check(capsys, "--golden", golden, "--ladder", "--only", "rung 08a", "--", *cmd)
    assert out.splitlines() == ["1 passed, 0 failed"]


def test_the_default_golden_directory_is_the_repositorys(capsys, fake):
    assert check_golden.DEFAULT_GOLDEN == REPO / "tests" / "data" / "golden"
    status, out, _ = check(capsys, "--only", "demo", "--", *fake, "right", "{}")
    assert (status, out) == (0, "1 passed, 0 failed\n")


@pytest.mark.parametrize("argv", [
    [],                                                 # no command
    ["--", "echo"],                                     # no {}
    ["--ladder", "--", "echo", "{}"],                   # --ladder without {rung}
    ["--", "echo", "--rung", "{rung}", "{}"],           # {rung} without --ladder
    ["-j", "0", "--", "echo", "{}"],
    ["--timeout", "0", "--", "echo", "{}"],
    ["--no-such-option", "--", "echo", "{}"],
    ["--only", "no such case", "--", "echo", "{}"],
    ["--golden", "MISSING", "--", "echo", "{}"],
    ["--golden", "EMPTY", "--", "echo", "{}"],
])
def test_bad_usage_exits_2(capsys, tmp_path, golden, argv):
    (tmp_path / "empty").mkdir()
    argv = [{"MISSING": tmp_path / "missing", "EMPTY": tmp_path / "empty"}.get(a, a) for a in argv]
    argv = argv if "--golden" in argv else ["--golden", golden, *argv]
    status, out, err = check(capsys, *argv)
    assert status == 2
    assert "passed" not in out
    assert err.strip()


def test_as_a_program(golden, fake):
    done = subprocess.run([sys.executable, str(SCRIPT), "--golden", str(golden), "--",
                           *fake, "wrong", "{}"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == "0 passed, 2 failed"
    done = subprocess.run([sys.executable, str(SCRIPT), "--golden", str(golden)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "after --" in done.stderr
