"""The `inferris-dist` command line, run as a user runs it: in a subprocess.

Exit status 0 done, 1 the engine failed, 2 bad input (exactly one line on
stderr, never a traceback). `--json` is SPEC §4 line for line; the human
output is one line per step, then the request table.
"""
from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path

import pytest

from inferris_dist.engine import run_workload
from inferris_dist.testing import comparable

from tests.helpers.external import GOLDEN, REPO, SCRIPT, cli

pytestmark = pytest.mark.procs          # starts processes (pytest -m 'not procs' skips)

GOLDEN_SPECS = sorted(p for p in GOLDEN.glob("*.spec.json")
                      if p.with_name(p.name.replace(".spec.json", ".trace.jsonl")).exists())


def trace_of(spec: Path) -> Path:
    return spec.with_name(spec.name.replace(".spec.json", ".trace.jsonl"))


def read_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def assert_json_output_is(proc: subprocess.CompletedProcess, golden: Path) -> None:
    got_text = proc.stdout.splitlines()
    want_text = golden.read_text().splitlines()
    assert len(got_text) == len(want_text), proc.stdout
    # byte for byte, except the text of an error line
    for got, want in zip(got_text, want_text):
        if '"error"' in want:
            assert comparable([json.loads(got)]) == comparable([json.loads(want)])
        else:
            assert got == want


def assert_usage_error(proc: subprocess.CompletedProcess, *names: str) -> str:
    """Exit 2, exactly one line on stderr naming what is wrong, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert proc.stderr.endswith("\n")
    line = lines[0]
    for name in names:
        assert name in line, f"{name!r} not named in {line!r}"
    return line


def write_spec(tmp_path: Path, obj, name: str = "spec.json") -> Path:
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


# -- run --json against the golden traces --------------------------------------------------

@pytest.mark.parametrize("spec", GOLDEN_SPECS, ids=lambda p: p.name.removesuffix(".spec.json"))
def test_run_json_matches_golden_trace(spec):
    proc = cli("run", "--json", "--spec", spec)
    want = read_lines(trace_of(spec).read_text())
    assert proc.returncode == (1 if "error" in want[-1] else 0), proc.stderr
    assert "Traceback" not in proc.stderr
    assert_json_output_is(proc, trace_of(spec))


def test_golden_specs_are_there():
    names = {p.name for p in GOLDEN_SPECS}
    assert {"demo.spec.json", "irreducible.spec.json"} <= names
    assert len(GOLDEN_SPECS) >= 10


def test_demo_json_equals_golden_demo_trace():
    proc = cli("demo", "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert_json_output_is(proc, GOLDEN / "demo.trace.jsonl")


def test_run_without_workload_runs_the_demo():
    proc = cli("run", "--json")
    assert proc.returncode == 0, proc.stderr
    assert_json_output_is(proc, GOLDEN / "demo.trace.jsonl")


@pytest.mark.skipif(not SCRIPT.exists(), reason="console script not installed next to python")
def test_console_script_demo_json():
    proc = cli("demo", "--json", cmd=[str(SCRIPT)])
    assert proc.returncode == 0, proc.stderr
    assert_json_output_is(proc, GOLDEN / "demo.trace.jsonl")


# -- human output ---------------------------------------------------------------------------

STEP_LINE = re.compile(r"^\s*(\d+)(?:-(\d+))?  \S")


def test_demo_human_output_one_line_per_step_then_request_table():
    proc = cli("demo")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = proc.stdout
    for bad in ("<", "SampleResult", "State.", "FinishReason.", "Request(", "\x1b["):
        assert bad not in out, f"{bad!r} in human output:\n{out}"
    golden = read_lines((GOLDEN / "demo.trace.jsonl").read_text())
    steps, summary = golden[:-1], golden[-1]["summary"]
    lines = out.splitlines()
    assert lines[0].startswith("demo:"), lines[0]           # the header
    step_lines = lines[1:1 + len(steps)]
    assert [int(STEP_LINE.match(s).group(1)) for s in step_lines] == [t["step"] for t in steps], out
    for line, t in zip(step_lines, steps):
        for rid, n in t["executed"].items():
            assert f"{rid}:{n}" in line, (line, t)
        for rid, why in t["finished"].items():
            assert f"{rid}:{why}" in line, (line, t)
    rest = lines[1 + len(steps):]
    assert rest[0].split() == ["request", "state", "generated", "computed", "finish"], out
    rows = rest[1:1 + len(summary)]
    for row, s in zip(rows, summary):
        assert row.split() == [s["request_id"], s["state"], str(s["generated"]),
                               str(s["computed"]), s["finish_reason"] or "-"], row
    # the table is the end of the output, but for the closing line and the summary lines
    # under it (inferris_dist/metrics.py: the demo drafts, so acceptance and mean batch)
    tail = rest[1 + len(summary):]
    assert tail == ["6 steps, 3/3 requests finished", "acceptance 5/7 drafted tokens (71.4%)",
                    "mean batch 5.2 tokens, 1.3 requests"], tail
    assert all(not STEP_LINE.match(line) for line in tail), tail


def test_human_output_collapses_idle_steps_and_reports_error_on_stderr():
    proc = cli("run", "--spec", GOLDEN / "irreducible.spec.json")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout
    err = proc.stderr.splitlines()
    assert len(err) == 1, proc.stderr
    assert "Irreducible" in err[0] and "4" in err[0], err
    out = proc.stdout
    assert "<" not in out and "State." not in out
    numbered = [STEP_LINE.match(line) for line in out.splitlines()[1:]]
    numbered = [int(m.group(1)) for m in numbered if m]
    assert numbered == [0, 1, 2, 3], out                    # step 2 is idle: still one line
    assert re.search(r"^huge\s+RUNNING\s+0\s+8\s+-$", out, re.M), out


# -- the --request form, stdin, knobs -------------------------------------------------------

def test_request_flags_build_the_workload():
    proc = cli("run", "--json", "--request", "a:6:3", "--request", "b:4:2:1")
    assert proc.returncode == 0, proc.stderr
    want = run_workload({"requests": [
        {"request_id": "a", "prompt_len": 6, "max_new_tokens": 3},
        {"request_id": "b", "prompt_len": 4, "max_new_tokens": 2, "arrival_step": 1}]})
    assert read_lines(proc.stdout) == want
    assert [s["request_id"] for s in want[-1]["summary"]] == ["a", "b"]
    assert want[1]["admitted"] == ["b"]


def test_request_flag_eos_after_and_knobs():
    proc = cli("run", "--json", "--request", "a:6:5:0:2", "--request", "b:3:4:2",
               "--page-size", "2", "--spec-len", "2", "--max-step-tokens", "5")
    assert proc.returncode == 0, proc.stderr
    want = run_workload({
        "engine": {"page_size": 2, "spec_len": 2, "max_step_tokens": 5},
        "requests": [
            {"request_id": "a", "prompt_len": 6, "max_new_tokens": 5, "eos_after": 2},
            {"request_id": "b", "prompt_len": 3, "max_new_tokens": 4, "arrival_step": 2}]})
    assert read_lines(proc.stdout) == want
    assert want[-1]["summary"][0]["finish_reason"] == "EOS"


def test_spec_from_stdin():
    spec = GOLDEN / "prefix_reuse.spec.json"
    proc = cli("run", "--json", "--spec", "-", stdin=spec.read_text())
    assert proc.returncode == 0, proc.stderr
    assert_json_output_is(proc, trace_of(spec))


def test_knobs_override_the_spec():
    spec = GOLDEN / "demo.spec.json"
    knobs = {"page_size": 2, "num_pages": 16, "max_step_tokens": 5, "spec_len": 1, "world_size": 2}
    args = []
    for key, value in knobs.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    proc = cli("run", "--json", "--spec", spec, *args)
    assert proc.returncode == 0, proc.stderr
    w = json.loads(spec.read_text())
    w["engine"].update(knobs)
    want = run_workload(copy.deepcopy(w))
    assert read_lines(proc.stdout) == want
    assert want != read_lines((GOLDEN / "demo.trace.jsonl").read_text())   # the knobs mattered
    human = cli("run", "--spec", spec, *args)
    header = human.stdout.splitlines()[0]
    for key, value in knobs.items():
        assert f"{key} {value}" in header, header


def test_knob_overrides_stdin_spec_too():
    spec = GOLDEN / "chunked_prefill.spec.json"
    proc = cli("run", "--json", "--spec", "-", "--max-step-tokens", "3", stdin=spec.read_text())
    assert proc.returncode == 0, proc.stderr
    w = json.loads(spec.read_text())
    w.setdefault("engine", {})["max_step_tokens"] = 3
    assert read_lines(proc.stdout) == run_workload(w)


# -- Irreducible ----------------------------------------------------------------------------

def test_irreducible_json_ends_with_error_object():
    proc = cli("run", "--json", "--spec", GOLDEN / "irreducible.spec.json")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = read_lines(proc.stdout)
    last = lines[-1]
    assert set(last) >= {"error", "message", "step"}, last
    assert last["error"] == "Irreducible" and last["step"] == 4, last
    assert isinstance(last["message"], str) and last["message"]
    assert not any("summary" in x for x in lines)
    assert [x["step"] for x in lines[:-1]] == [0, 1, 2, 3]


def test_irreducible_human_names_it_on_one_stderr_line():
    proc = cli("run", "--spec", GOLDEN / "irreducible.spec.json")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Irreducible" in lines[0], proc.stderr


# -- bad input: exit 2, one line, no traceback ----------------------------------------------

BASE_REQUEST = {"request_id": "a", "prompt_len": 4, "max_new_tokens": 2}


def with_request(**changes) -> dict:
    req = {**BASE_REQUEST, **changes}
    return {"requests": [{k: v for k, v in req.items() if v is not ...}]}


BAD_SPECS = {
    "unknown_engine_key": ({"engine": {"pages": 4}}, ["pages"]),
    "unknown_top_key": ({"engine": {}, "requests": [], "extra": 1}, ["extra"]),
    "unknown_request_key": (with_request(colour="red"), ["colour", "a"]),
    "engine_wrong_type_str": ({"engine": {"page_size": "4"}}, ["page_size"]),
    "engine_wrong_type_bool": ({"engine": {"num_pages": True}}, ["num_pages"]),
    "engine_wrong_type_float": ({"engine": {"max_step_tokens": 2.5}}, ["max_step_tokens"]),
    "engine_not_object": ({"engine": [1, 2]}, ["engine"]),
    "requests_not_list": ({"requests": {"a": 1}}, ["requests"]),
    "request_wrong_type": (with_request(max_new_tokens="2"), ["max_new_tokens", "a"]),
    "tokens_wrong_type": (with_request(prompt_len=..., tokens=[1, "x"]), ["tokens", "a"]),
    "tokens_empty": (with_request(prompt_len=..., tokens=[]), ["tokens", "a"]),
    "both_tokens_and_prompt_len": (with_request(tokens=[1, 2]), ["tokens", "prompt_len"]),
    "accept_script_wrong_type": (with_request(accept_script=[1, 1.5]), ["accept_script", "a"]),
    "request_id_not_string": (with_request(request_id=7), ["request_id"]),
    "duplicate_request_id": ({"requests": [BASE_REQUEST, BASE_REQUEST]}, ["duplicate", "a"]),
    "page_size_0": ({"engine": {"page_size": 0}}, ["page_size", "0"]),
    "num_pages_negative": ({"engine": {"num_pages": -3}}, ["num_pages", "-3"]),
    "world_size_0": ({"engine": {"world_size": 0}}, ["world_size"]),
    "spec_len_negative": ({"engine": {"spec_len": -1}}, ["spec_len", "-1"]),
    "max_new_tokens_0": (with_request(max_new_tokens=0), ["max_new_tokens", "a", "0"]),
    "max_new_tokens_missing": (with_request(max_new_tokens=...), ["max_new_tokens", "a"]),
    "prompt_len_0": (with_request(prompt_len=0), ["prompt_len", "a"]),
    "arrival_step_negative": (with_request(arrival_step=-1), ["arrival_step", "a", "-1"]),
    "eos_after_negative": (with_request(eos_after=-2), ["eos_after", "a"]),
    "workload_not_object": ([1, 2, 3], ["object"]),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_spec_exits_2_with_one_line(case, tmp_path):
    obj, names = BAD_SPECS[case]
    proc = cli("run", "--spec", write_spec(tmp_path, obj))
    assert_usage_error(proc, *names)
    assert proc.stdout == ""


def test_bad_spec_json_mode_too(tmp_path):
    proc = cli("run", "--json", "--spec", write_spec(tmp_path, {"engine": {"page_size": 0}}))
    assert_usage_error(proc, "page_size")
    assert proc.stdout == ""


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.json"
    assert_usage_error(cli("run", "--spec", missing), "nope.json")


def test_non_json_file(tmp_path):
    assert_usage_error(cli("run", "--spec", write_spec(tmp_path, "{not json", "bad.json")),
                       "bad.json", "JSON")


def test_directory_as_spec(tmp_path):
    assert_usage_error(cli("run", "--spec", tmp_path))


def test_non_json_stdin():
    assert_usage_error(cli("run", "--spec", "-", stdin="engine: {}\n"), "JSON")


def test_spec_and_request_are_exclusive():
    proc = cli("run", "--spec", GOLDEN / "demo.spec.json", "--request", "a:6:3")
    assert_usage_error(proc, "--spec", "--request")


@pytest.mark.parametrize("flag", ["a:b", "x:1", "x:1:2:3:4:5", ":4:2", "x:y:2", "x:4:2:z"])
def test_malformed_request_flag(flag):
    assert_usage_error(cli("run", "--request", flag), flag)


@pytest.mark.parametrize("flag,names", [("x:0:2", ["prompt_len"]), ("x:4:0", ["max_new_tokens"]),
                                        ("x:4:2:-1", ["arrival_step"])])
def test_request_flag_out_of_range(flag, names):
    assert_usage_error(cli("run", "--request", flag), *names)


def test_duplicate_request_flags():
    assert_usage_error(cli("run", "--request", "a:4:2", "--request", "a:3:1"), "duplicate", "a")


@pytest.mark.parametrize("args,names", [
    (["--page-size", "abc"], ["--page-size", "abc"]),
    (["--num-pages", "1.5"], ["--num-pages"]),
    (["--page-size", "0"], ["page_size"]),
    (["--max-step-tokens", "0"], ["max_step_tokens"]),
    (["--world-size", "0"], ["world_size"]),
    (["--bogus-flag"], ["--bogus-flag"]),
])
def test_bad_knob(args, names):
    assert_usage_error(cli("run", "--request", "a:4:2", *args), *names)


def test_unknown_subcommand():
    assert_usage_error(cli("frobnicate"), "frobnicate")


def test_no_subcommand():
    assert_usage_error(cli())


# -- the commands and their flags ---------------------------------------------------------------

def test_every_command_is_a_module_with_its_flags_and_its_run(capsys):
    """A command is cli/cmd_NAME.py (add_arguments, main) and its line in the table: its --help
    is built from the module alone."""
    from inferris_dist.cli.main import COMMANDS, build_parser, command
    for name in COMMANDS:
        module = command(name)
        assert callable(module.add_arguments) and callable(module.main), name
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([name, "--help"])
        assert done.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: inferris-dist {name}"), name


def test_launch_like_defaults_are_the_libraries():
    """A flag of a run on processes defaults to LaunchOptions' field (the library's), shown so
    in --help; chaos's step timeout is derived from the workload's steps unless given (the
    chaos harness's default, for a session made without one)."""
    from inferris_dist.chaos.harness import DEFAULT_STEP_TIMEOUT
    from inferris_dist.cli.main import build_parser
    from inferris_dist.scheduler.options import LaunchOptions
    library = LaunchOptions()
    shared = ("step_timeout", "max_restarts", "audit_every", "on_rank_loss", "exec_cost")
    for argv, fields in ((["launch"], shared + ("join_timeout", "rejoin_timeout")), (["compare"], shared)):
        args = build_parser().parse_args(argv)
        assert {f: getattr(args, f) for f in fields} == {f: getattr(library, f) for f in fields}, argv
    chaos = build_parser().parse_args(["chaos"])
    assert (chaos.step_timeout, chaos.max_restarts) == (None, library.max_restarts)
    assert f"with --shard, {DEFAULT_STEP_TIMEOUT:g}" in " ".join(cli("chaos", "--help").stdout.split())
    text = " ".join(cli("launch", "--help").stdout.split())      # as read, not as wrapped
    assert f"(default {library.step_timeout:g})" in text and f"(default {library.max_restarts})" in text


# -- mechs ----------------------------------------------------------------------------------

def mechs_rows() -> list[list[str]]:
    proc = cli("mechs")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines[-1].startswith("inferris-dist mechs NAME")
    assert lines[-2].startswith("* beyond the original design")
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[:-2]]
    assert rows[0] == ["#", "mechanism", "key question", "rung", "module", "tests"], rows[0]
    return rows[1:]


ORIGINAL_ORDER = ["engine loop", "continuous batching", "token budget", "paged state", "chunked prefill",
                  "preemption", "prefix hash", "radix cache", "cache-aware scheduling",
                  "speculative decoding", "executor boundary", "parallelism"]


def test_mechs_lists_the_twelve_in_the_original_order_and_two_beyond_with_real_modules_and_tests():
    from inferris_dist.engine.rungs import NAMES
    rows = mechs_rows()
    assert [r[1] for r in rows] == ORIGINAL_ORDER + ["overlap scheduling *", "elastic world *"]
    assert [r[0] for r in rows] == [f"{i:02d}" for i in range(1, 15)]
    for row in rows:
        assert len(row) == 6, row
        assert row[3] in NAMES, row
        assert row[4].endswith(".py") and (REPO / row[4]).is_file(), f"no module {row[4]}"
        assert (REPO / row[5]).is_file(), f"no tests {row[5]}"


@pytest.mark.parametrize("name", ["paged-state", "4", "04", "paged state", "paged"])
def test_mechs_name_prints_the_note(name):
    proc = cli("mechs", name)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# 04. Paged state")


@pytest.mark.parametrize("name", ["nope", "p"])          # unknown; ambiguous (paged, preemption, ...)
def test_mechs_unknown_name_is_bad_input(name):
    proc = cli("mechs", name)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "paged-state" in proc.stderr
