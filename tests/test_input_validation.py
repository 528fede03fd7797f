"""Untrusted input, read bounded and parsed strictly, one section per kind:

1. key files are capped at a few kB: a 2 GB secret or a 300 MB public key is refused unread,
   in one line naming the file and the cap, not read into memory for a minute;
2. a secret key open to others, or owned by another user, is refused as ssh refuses it, with
   the command that fixes it;
3. a worker takes its rank and world size from one launcher, never one from each, and reads
   ranks, sizes and ports as the digits 0-9 only;
4. a request id that cannot be encoded as UTF-8 (a lone surrogate) is bad input at workload
   load time, alike for run, launch and compare;
5. numbers past what the code can use are bad input, alike for run and launch, and a library
   option of the wrong kind is bad input before anything starts;
6. terminal control in request ids is shown escaped;
7. errors name the file, the source and the real problem.

Every file here is sparse or a few hundred bytes; every process is bounded in time (and the
worker fed a 2 GB key, in address space).
"""
from __future__ import annotations

import json
import os
import pwd
import resource
import stat
import subprocess
import time
from pathlib import Path

import pytest

from inferris_dist.engine import WorkloadError, load_workload
from inferris_dist.protocol import keys as key_module
from inferris_dist.protocol import placement
from inferris_dist.protocol.keys import ClientKeys, KeyFileError, ServerKeys
from inferris_dist.protocol.placement import PlacementError, check_address, place

from tests.helpers.external import CLI, ENV, GOLDEN, REPO, cli

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]

DEMO = GOLDEN / "demo.spec.json"
NOWHERE = "tcp://127.0.0.1:9"           # nothing listens: a worker placed there would wait


def run(*args, env: dict | None = None, timeout: float = 30, limit_as: int | None = None
        ) -> subprocess.CompletedProcess:
    """`inferris-dist ARGS...` with extra environment, optionally in a bounded address space."""
    def bounded():
        if limit_as:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, cwd=REPO,
                          env={**ENV, **(env or {})}, timeout=timeout, stdin=subprocess.DEVNULL,
                          preexec_fn=bounded if limit_as else None)


def one_line(done: subprocess.CompletedProcess, status: int = 2) -> str:
    """The single stderr line of a command that failed with `status` (no traceback)."""
    assert done.returncode == status, (done.returncode, done.stderr[-2000:])
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr


# -- 1. key files have a size cap -----------------------------------------------------------------

def behind_a_hole(path, size: int) -> None:
    """Put a key file's own text behind `size` bytes of hole (sparse: no disk): a reader that
    stops once it has the key still reads all of the hole first."""
    text = path.read_bytes()
    with open(path, "wb") as f:             # keeps the file's mode and owner
        f.truncate(size)
        f.seek(size)
        f.write(text)


def test_a_2_gb_secret_key_is_refused_unread(keys):
    behind_a_hole(keys / "rank-0.key_secret", 2 << 30)
    # in 1 GB of address space, reading the file would fail; refusing it must not
    done = run("worker", "--connect", NOWHERE, "--keys", keys, "--rank", 0, "--world-size", 4,
               "--join-timeout", 2, limit_as=1 << 30)
    line = one_line(done)
    assert "rank-0.key_secret" in line and str(key_module.KEY_FILE_MAX) in line, line


def test_a_300_mb_public_key_does_not_keep_the_scheduler_busy(keys):
    behind_a_hole(keys / "rank-3.key", 300 << 20)
    began = time.monotonic()
    done = cli("launch", "--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", DEMO,
               "--world-size", 4, "--join-timeout", 5, timeout=20)
    line = one_line(done)
    assert "rank-3.key" in line and str(key_module.KEY_FILE_MAX) in line, line
    assert time.monotonic() - began < 15


def test_the_cap_is_a_few_kb_and_a_file_at_it_still_loads(keys):
    assert 1024 <= key_module.KEY_FILE_MAX <= 16384
    secret = keys / "rank-1.key_secret"
    text = secret.read_bytes()
    padded = b"#" * (key_module.KEY_FILE_MAX - len(text) - 1) + b"\n" + text      # comments up to the cap
    assert len(padded) == key_module.KEY_FILE_MAX
    secret.write_bytes(padded)
    ClientKeys.load(keys, 1)                                           # at the cap: fine
    secret.write_bytes(b"#" + padded)                                  # one byte over
    with pytest.raises(KeyFileError, match=f"rank-1.key_secret.*{key_module.KEY_FILE_MAX}") as e:
        ClientKeys.load(keys, 1)
    assert "\n" not in str(e.value)
    public = keys / "rank-2.key"
    public.write_bytes(b"#" * (key_module.KEY_FILE_MAX + 1))
    with pytest.raises(KeyFileError, match=f"rank-2.key .*{key_module.KEY_FILE_MAX}"):
        ServerKeys.load(keys, 4)


def test_a_key_that_is_not_a_regular_file_is_refused_without_blocking(keys):
    (keys / "rank-0.key_secret").unlink()
    os.mkfifo(keys / "rank-0.key_secret", 0o600)        # nobody writes: opening it could block
    with pytest.raises(KeyFileError, match="rank-0.key_secret"):
        ClientKeys.load(keys, 0)
    (keys / "rank-1.key").unlink()
    (keys / "rank-1.key").symlink_to("/dev/zero")       # endless
    with pytest.raises(KeyFileError, match="rank-1.key"):
        ServerKeys.load(keys, 4)


# -- 2. secrets must be private and ours ----------------------------------------------------------

@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620], ids=oct)
def test_a_secret_key_open_to_others_is_refused_with_the_chmod_command(keys, mode):
    secret = keys / "rank-0.key_secret"
    os.chmod(secret, mode)
    with pytest.raises(KeyFileError, match=f"chmod 600 {secret}"):
        ClientKeys.load(keys, 0)
    line = one_line(run("worker", "--connect", NOWHERE, "--keys", keys, "--rank", 0,
                        "--world-size", 4, "--join-timeout", 2))
    assert f"chmod 600 {secret}" in line and oct(mode)[2:] in line, line
    os.chmod(keys / "scheduler.key_secret", mode)
    with pytest.raises(KeyFileError, match=f"chmod 600 {keys / 'scheduler.key_secret'}"):
        ServerKeys.load(keys, 4)
    line = one_line(cli("launch", "--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", DEMO,
                        "--world-size", 4, "--join-timeout", 2))
    assert f"chmod 600 {keys / 'scheduler.key_secret'}" in line, line


def test_a_secret_key_owned_by_another_user_is_refused(keys):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    nobody = pwd.getpwnam("nobody")
    secret = keys / "rank-0.key_secret"
    os.chown(secret, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(KeyFileError, match="rank-0.key_secret.*nobody.*must be yours"):
        ClientKeys.load(keys, 0)
    line = one_line(run("worker", "--connect", NOWHERE, "--keys", keys, "--rank", 0,
                        "--world-size", 4, "--join-timeout", 2))
    assert "nobody" in line and "must be yours" in line, line
    os.chown(keys / "scheduler.key_secret", nobody.pw_uid, nobody.pw_gid)
    line = one_line(cli("launch", "--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", DEMO,
                        "--world-size", 4, "--join-timeout", 2))
    assert "scheduler.key_secret" in line and "nobody" in line, line


def test_keys_the_keys_command_writes_still_load(tmp_path):
    d = tmp_path / "k"
    assert cli("keys", d, "--world-size", 2).returncode == 0
    assert stat.S_IMODE((d / "rank-0.key_secret").stat().st_mode) == 0o600
    ServerKeys.load(d, 2)
    ClientKeys.load(d, 0)
    os.chmod(d / "rank-1.key_secret", 0o400)             # stricter than 0600 is fine
    ClientKeys.load(d, 1)
    os.chmod(d / "rank-1.key", 0o644)                    # public keys are for everyone
    ServerKeys.load(d, 2)


# -- 3. placement: one launcher, digits only ------------------------------------------------------

@pytest.mark.parametrize("env,names", [
    ({"SLURM_PROCID": "1", "WORLD_SIZE": "4"}, ("SLURM_PROCID", "WORLD_SIZE")),
    ({"RANK": "1", "SLURM_NTASKS": "4"}, ("RANK", "SLURM_NTASKS")),
    ({"PMI_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}, ("PMI_RANK", "OMPI_COMM_WORLD_SIZE")),
    ({"JOB_COMPLETION_INDEX": "1", "PMI_SIZE": "4"}, ("JOB_COMPLETION_INDEX", "PMI_SIZE")),
    # a stray RANK beside a whole Slurm placement: which rank is meant is not ours to guess
    ({"RANK": "1", "SLURM_PROCID": "3", "SLURM_NTASKS": "8"}, ("RANK", "SLURM_NTASKS")),
])
def test_rank_and_world_size_from_different_launchers_is_an_error(env, names):
    with pytest.raises(PlacementError) as e:
        place(None, None, NOWHERE, env)
    assert all(n in str(e.value) for n in names) and "--world-size" in str(e.value), e.value
    assert "\n" not in str(e.value)
    p = place(None, 4 if "SLURM_NTASKS" not in env else 8, NOWHERE, env)    # the flag wins
    assert "world size from --world-size" in p.said and names[0] in p.said
    line = one_line(run("worker", "--connect", NOWHERE, "--join-timeout", 2, env=env))
    assert all(n in line for n in names), line


def test_rank_and_world_size_from_one_launcher_still_place():
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "WORLD_SIZE": "9", "MASTER_ADDR": "h",
           "MASTER_PORT": "29500"}
    p = place(None, None, None, env)
    assert (p.rank, p.world_size, p.address) == (1, 4, "tcp://h:29500")
    assert "SLURM_PROCID and world size from SLURM_NTASKS (Slurm's srun)" in p.said
    p = place(2, None, NOWHERE, {"PMI_SIZE": "4"})              # a rank flag, a launcher's size
    assert (p.rank, p.world_size) == (2, 4)


NOT_DIGITS = [" +1_0 ", "+1", "1_0", " 1", "1 ", "1\n", "-0", "0x1", "\u0661", "\uff11",
              "1\x1b[2J", "", "1.0", "١٢"]


@pytest.mark.parametrize("value", NOT_DIGITS, ids=repr)
@pytest.mark.parametrize("var", ["RANK", "WORLD_SIZE", "MASTER_PORT"])
def test_ranks_sizes_and_ports_are_digits_0_to_9_only(var, value):
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500", var: value}
    if value == "":
        if var == "MASTER_PORT":
            with pytest.raises(PlacementError, match="no scheduler address"):
                place(None, None, None, env)
        else:
            with pytest.raises(PlacementError, match=f"no {'rank' if var == 'RANK' else 'world size'}"):
                place(None, None, None, env)
        return
    with pytest.raises(PlacementError) as e:
        place(None, None, None, env)
    text = str(e.value)
    assert var in text and repr(value) in text and "0-9" in text, text
    assert text.isprintable(), text                      # escaped: no newline, no escape sequence


@pytest.mark.parametrize("value", ["\u0661", " +1_0 ", "1\n"], ids=repr)
def test_a_worker_refuses_a_non_digit_variable_in_one_line(value):
    line = one_line(run("worker", "--connect", NOWHERE, "--join-timeout", 2,
                        env={"RANK": value, "WORLD_SIZE": "20"}))
    assert "RANK" in line and repr(value) in line, line


def test_huge_numbers_are_out_of_range_not_a_crash():
    for env in ({"RANK": "1" * 5000, "WORLD_SIZE": "2"}, {"RANK": "0", "WORLD_SIZE": "9" * 5000},
                {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "9" * 5000}):
        with pytest.raises(PlacementError, match="RANK|WORLD_SIZE|MASTER_PORT"):
            place(None, None, None, env)
    assert place(None, None, NOWHERE, {"RANK": "0003", "WORLD_SIZE": "0004"}).rank == 3


@pytest.mark.parametrize("address", ["tcp://h:\u0661\u0662", "tcp://h:+12", "tcp://h:1_2",
                                     "tcp://h: 12", "tcp://h:\uff11"], ids=repr)
def test_ports_in_addresses_are_digits_0_to_9_only(address):
    with pytest.raises(PlacementError, match="--connect"):
        check_address(address, "--connect", can_bind_any=False)
    with pytest.raises(PlacementError, match="--connect"):
        place(0, 1, address, {})
    one_line(cli("launch", "--listen", address.replace("//h:", "//127.0.0.1:"), "--spec", DEMO))


@pytest.mark.parametrize("value", NOT_DIGITS, ids=repr)
def test_digits_arg_takes_digits_0_to_9_only(value):
    import argparse
    with pytest.raises(argparse.ArgumentTypeError) as e:
        placement.digits_arg(value)
    assert repr(value) in str(e.value) and "0-9" in str(e.value)
    assert placement.digits_arg("12") == 12 and placement.digits_arg("007") == 7


@pytest.mark.parametrize("flag", ["--rank", "--world-size"])
def test_worker_flags_are_digits_0_to_9_only(flag):
    other = {"--rank": ("--world-size", "20"), "--world-size": ("--rank", "0")}[flag]
    line = one_line(run("worker", "--connect", NOWHERE, "--join-timeout", 2, *other, flag, " +1_0 "))
    assert flag in line and repr(" +1_0 ") in line, line


# -- 4. a request id must be encodable as UTF-8 ---------------------------------------------------

SURROGATE_SPEC = {"engine": {"world_size": 2},
                  "requests": [{"request_id": "ok", "prompt_len": 4, "max_new_tokens": 2},
                               {"request_id": "a\ud800", "prompt_len": 4, "max_new_tokens": 2}]}


def test_a_lone_surrogate_request_id_is_refused_at_load():
    with pytest.raises(WorkloadError, match=r"request 1: 'request_id' must be encodable as UTF-8") as e:
        load_workload(SURROGATE_SPEC)
    assert str(e.value).encode() and "\n" not in str(e.value)   # the message itself encodes


@pytest.mark.parametrize("command", ["run", "launch", "compare"])
def test_a_lone_surrogate_request_id_is_bad_input_for_every_command(tmp_path, command):
    spec = tmp_path / "surrogate.json"
    spec.write_text(json.dumps(SURROGATE_SPEC))          # ensure_ascii: the file holds "\ud800"
    line = one_line(cli(command, "--spec", spec))
    assert "request 1" in line and "UTF-8" in line, line
    # the same from --request: an undecodable byte in argv arrives as a lone surrogate
    line = one_line(cli(command, "--request", "ok:4:2", "--request", "b\udcff:4:2"))
    assert "request 1" in line and "UTF-8" in line, line


@pytest.mark.parametrize("command", ["run", "launch"])
def test_a_spec_on_stdin_that_is_not_utf8_is_bad_input(command):
    spec = b'{"requests": [{"request_id": "a\xff", "prompt_len": 4, "max_new_tokens": 2}]}'
    for encoding in ("utf-8", "utf-8:surrogateescape"):   # stdin strict, or as a C locale reads it
        done = subprocess.run([*CLI, command, "--spec", "-"], input=spec, capture_output=True,
                              cwd=REPO, env={**ENV, "PYTHONIOENCODING": encoding}, timeout=30)
        err = done.stderr.decode(errors="replace")
        assert done.returncode == 2 and err.count("\n") == 1, (encoding, done.returncode, err)
        assert "UTF-8" in err and "Traceback" not in err, err


# -- 5. numbers past what the code can use -------------------------------------------------------

@pytest.mark.parametrize("args", [("--step-timeout", "2147484"), ("--step-timeout", "1e10"),
                                  ("--join-timeout", "1e300"), ("--rejoin-timeout", "86401")])
def test_timeouts_past_what_a_socket_can_wait_are_bad_input(args):
    done = cli("launch", *args)
    assert done.returncode == 2 and "86400" in done.stderr and done.stderr.count("\n") == 1, done


def test_run_and_launch_accept_or_refuse_a_workload_alike(tmp_path):
    for script, ok in (([10 ** 23], False), ([-(2 ** 63)], False), ([1 << 24], True), ([3, 0], True)):
        spec = tmp_path / "w.json"
        spec.write_text(json.dumps({"engine": {"spec_len": 2}, "requests": [
            {"request_id": "a", "prompt_len": 3, "max_new_tokens": 3, "accept_script": script}]}))
        ran, launched = cli("run", "--spec", spec, "--json"), cli("launch", "--spec", spec, "--json")
        assert ran.returncode == launched.returncode == (0 if ok else 2), (script, ran, launched)
        assert ran.stdout == launched.stdout
        if not ok:
            assert "accept_script" in ran.stderr and ran.stderr == launched.stderr



@pytest.mark.parametrize("options,says", [
    ({"exec_cost": 5}, "exec_cost must be an ExecCost or its text"),
    ({"exec_cost": "fast"}, "exec_cost 'fast': no unit"),
    ({"audit_every": "3"}, "audit_every must be an int, got '3'"),
    ({"max_restarts": None}, "max_restarts must be an int, got None"),
])
def test_a_library_option_of_the_wrong_kind_is_bad_input_before_anything_starts(options, says):
    import inferris_dist
    with pytest.raises(WorkloadError, match=says):
        with inferris_dist.launch(str(DEMO), world_size=2, **options):
            pytest.fail("the group started")


def test_a_library_exec_cost_may_be_given_as_the_flag_takes_it():
    import inferris_dist
    from inferris_dist.protocol.limits import parse_exec_cost
    text = "1ms+2us/token"
    assert inferris_dist.LaunchOptions(exec_cost=text).read().exec_cost == parse_exec_cost(text)
    with inferris_dist.launch(str(DEMO), world_size=2, exec_cost="1ms") as engine:
        assert sum(1 for _ in engine.run()) == 6


def test_a_process_group_reads_an_exec_cost_given_as_text_too():
    import inferris_dist
    from inferris_dist.protocol.limits import parse_exec_cost
    from inferris_dist.scheduler.group import ProcessGroup
    from inferris_dist.scheduler.recovery import DistributedEngine
    workload = load_workload(DEMO).with_config(world_size=1)
    with ProcessGroup(workload, inferris_dist.LaunchOptions(world_size=1, exec_cost="1ms")) as group:
        assert group.options.exec_cost == parse_exec_cost("1ms")
        assert sum(1 for _ in DistributedEngine(workload, group).run()) == 6

# -- 6. terminal control in names ----------------------------------------------------------------

@pytest.mark.parametrize("command", ["run", "launch"])
def test_request_ids_with_terminal_control_are_shown_escaped(tmp_path, command):
    evil = "a\x1b[2J\x1b[Hfake\n    9  admit x\r\u202eb"
    spec = tmp_path / "evil.json"
    spec.write_text(json.dumps({"engine": {}, "requests": [
        {"request_id": evil, "prompt_len": 3, "max_new_tokens": 2},
        {"request_id": "plain", "prompt_len": 3, "max_new_tokens": 2}]}))
    done = cli(command, "--spec", spec)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\r" not in done.stdout and "\u202e" not in done.stdout
    assert "a\\x1b[2J\\x1b[Hfake\\x0a    9  admit x\\x0d\\u202eb" in done.stdout
    assert not any(line.startswith("    9") for line in done.stdout.splitlines())
    as_json = cli(command, "--spec", spec, "--json")
    assert json.loads(as_json.stdout.splitlines()[0])["admitted"][0] == evil


def test_a_bad_workload_names_an_evil_id_escaped(tmp_path):
    spec = tmp_path / "evil.json"
    spec.write_text(json.dumps({"engine": {}, "requests": [
        {"request_id": "x\x1b]0;owned\x07", "prompt_len": 0, "max_new_tokens": 2}]}))
    done = cli("run", "--spec", spec)
    assert done.returncode == 2 and "\x1b" not in done.stderr and "\x07" not in done.stderr


# -- 7. errors that name their cause -------------------------------------------------------------

@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("flag", ["--wire-log", "--timeline"])
def test_a_full_output_file_is_named_and_the_run_finishes(as_json, flag):
    """A wire log or timeline on a full disk is named (stderr, exit 1);
    the run goes on to its end and its summary stands."""
    done = cli("launch", flag, "/dev/full", *(["--json"] if as_json else []))
    assert done.returncode == 1
    assert f"{flag} /dev/full: No space left on device" in done.stderr
    assert "Traceback" not in done.stderr
    if as_json:
        assert done.stdout == (GOLDEN / "demo.trace.jsonl").read_text()   # every step, the summary
    else:
        assert "3/3 requests finished" in done.stdout and "none left running" in done.stdout


def test_a_bad_fault_in_the_workload_says_it_came_from_the_workload(tmp_path):
    spec = tmp_path / "f.json"
    spec.write_text(json.dumps({"engine": {"world_size": 2}, "requests": [
        {"request_id": "a", "prompt_len": 3, "max_new_tokens": 2}], "faults": ["0:crash@1", "5:hang@2"]}))
    for command in ("run", "launch"):
        done = cli(command, "--spec", spec)
        assert done.returncode == 2
        assert "workload 'faults' entry 1 '5:hang@2': rank 5 is outside 0..1" in done.stderr, done.stderr
        assert "--fault" not in done.stderr.split("(want")[0]


def test_a_negative_fault_rank_is_out_of_range_not_a_missing_argument():
    done = cli("launch", "--fault", "-1:crash@3")
    assert done.returncode == 2 and "rank -1 is outside 0..3" in done.stderr, done.stderr


@pytest.mark.parametrize("args, says", [
    (["launch", "--worldsize", "4"],
     "inferris-dist launch: unknown flag --worldsize (did you mean --world-size?)"),
    (["launch", "--world", "4"], "inferris-dist launch: unknown flag --world (did you mean --world-size?)"),
    (["run", "--fault", "1:crash@2"],
     "inferris-dist run: --fault is a flag of compare and launch, not of run"),
    (["compare", "--on-rank", "restore"], "did you mean --on-rank-loss?"),
])
def test_a_mistyped_or_misplaced_flag_names_the_closest_and_no_prefix_is_taken(args, says):
    done = subprocess.run([*CLI, *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and says in done.stderr, done.stderr
