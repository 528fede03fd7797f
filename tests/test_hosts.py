"""Ranks the scheduler did not start: keys, placement, `launch --listen`, authentication,
rejoining, and workers that never outlive their scheduler. On loopback, real processes.

(The same across network namespaces, with a partition, is test_netns_hosts.py; under a
real cluster launcher, test_mpiexec.py.)
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat

import pytest

from inferris_dist.protocol.keys import ClientKeys, KeyFileError, ServerKeys, write_keys
from inferris_dist.protocol.placement import LAUNCHERS, PlacementError, place

from tests.helpers.external import GOLDEN, REPO, Scheduler, cli, exit_line, long_spec, run_json, start_worker

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]

LONG = GOLDEN / "preemption.spec.json"         # enough steps to act in the middle of a run
DEMO_ARGS = ("--spec", GOLDEN / "demo.spec.json")



# -- keys ----------------------------------------------------------------------------------------

def test_keys_command_writes_a_pair_per_rank_with_private_secrets(tmp_path):
    d = tmp_path / "k"
    done = cli("keys", d, "--world-size", 3)
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in d.iterdir())
    assert names == sorted(f"{n}{ext}" for n in ["scheduler", "rank-0", "rank-1", "rank-2"]
                           for ext in (".key", ".key_secret"))
    for p in d.iterdir():
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o600 if p.name.endswith("_secret") else 0o644), (p.name, oct(mode))
    server = ServerKeys.load(d, 3)
    assert sorted(server.rank_of_key.values()) == [0, 1, 2]
    for r in range(3):
        client = ClientKeys.load(d, r)
        assert client.server_public == server.public
        assert server.rank_of_key[client.public] == r


def test_keys_refuses_to_overwrite_without_force(tmp_path):
    d = tmp_path / "k"
    assert cli("keys", d, "--world-size", 2).returncode == 0
    before = (d / "rank-1.key_secret").read_bytes()
    again = cli("keys", d, "--world-size", 2)
    assert again.returncode == 2 and "--force" in again.stderr and len(again.stderr.splitlines()) == 1
    assert (d / "rank-1.key_secret").read_bytes() == before
    forced = cli("keys", d, "--world-size", 2, "--force")
    assert forced.returncode == 0, forced.stderr
    assert (d / "rank-1.key_secret").read_bytes() != before
    assert not [p for p in d.iterdir() if p.name.startswith(".keys-")]   # no temp dir left


@pytest.mark.parametrize("args", [("--world-size", 0), ("--world-size", "x"), ()])
def test_keys_bad_input(tmp_path, args):
    done = cli("keys", tmp_path / "k", *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1


def test_key_files_missing_or_broken_are_bad_input(tmp_path, keys):
    with pytest.raises(KeyFileError, match="rank-4.key"):
        ServerKeys.load(keys, 6)
    (keys / "rank-1.key").write_text("not a certificate\n")
    with pytest.raises(KeyFileError, match="rank-1.key"):
        ServerKeys.load(keys, 2)
    done = cli("launch", "--listen", "tcp://127.0.0.1:0", "--keys", keys, *DEMO_ARGS, "--world-size", 2)
    assert done.returncode == 2 and "rank-1.key" in done.stderr, done.stderr


# -- placement -----------------------------------------------------------------------------------

@pytest.mark.parametrize("rank_var,size_var,who", LAUNCHERS)
def test_each_launcher_convention_places_the_worker(rank_var, size_var, who):
    env = {rank_var: "2", "MASTER_ADDR": "192.0.2.1", "MASTER_PORT": "29500"}
    if size_var:
        env[size_var] = "4"
    p = place(None, None if size_var else 4, None, env)
    assert (p.rank, p.world_size, p.address) == (2, 4, "tcp://192.0.2.1:29500")
    assert rank_var in p.said and who in p.said


def test_placement_order_flags_then_launchers_in_order():
    env = {"RANK": "1", "WORLD_SIZE": "4", "SLURM_PROCID": "3", "SLURM_NTASKS": "8", "PMI_RANK": "0"}
    assert place(None, None, "tcp://h:1", env).rank == 1                  # torchrun first
    assert place(3, None, "tcp://h:1", env).rank == 3                     # the flag wins
    env.pop("RANK"); env.pop("WORLD_SIZE")
    p = place(None, None, "tcp://h:1", env)
    assert (p.rank, p.world_size) == (3, 8) and "SLURM_PROCID" in p.said   # then Slurm
    p = place(None, None, "tcp://h:9", {"PMI_RANK": "1", "PMI_SIZE": "2", "MASTER_ADDR": "x",
                                         "MASTER_PORT": "1"})
    assert p.address == "tcp://h:9"                                     # --connect wins


@pytest.mark.parametrize("rank,size,connect,env,words", [
    (None, 2, "tcp://h:1", {}, "no rank"),
    (0, None, "tcp://h:1", {"JOB_COMPLETION_INDEX": "0"}, "no world size"),
    (None, None, "tcp://h:1", {"JOB_COMPLETION_INDEX": "0"}, "no world size"),
    (2, 2, "tcp://h:1", {}, "outside 0..1"),
    (None, None, "tcp://h:1", {"RANK": "x", "WORLD_SIZE": "2"}, "not an integer"),
    (0, 2, None, {}, "no scheduler address"),
    (0, 2, "h:1", {}, "tcp://HOST:PORT"),
    (0, 0, "tcp://h:1", {}, "outside 1.."),
])
def test_placement_errors(rank, size, connect, env, words):
    with pytest.raises(PlacementError, match=words):
        place(rank, size, connect, env)


def test_worker_without_a_rank_is_bad_input_in_one_line():
    done = cli("worker", "--connect", "tcp://127.0.0.1:9")
    assert done.returncode == 2 and "no rank" in done.stderr and done.stderr.count("\n") == 1


# -- launch --listen: the flags ------------------------------------------------------------------

@pytest.mark.parametrize("args,words", [
    (("--listen", "tcp://192.0.2.1:0"), "--keys"),                   # off loopback, plaintext
    (("--listen", "tcp://0.0.0.0:5555"), "--keys"),
    (("--keys", "nowhere"), "--keys needs --listen"),
    (("--listen", "127.0.0.1:5555"), "tcp://HOST:PORT"),
    (("--listen", "tcp://127.0.0.1:99999"), "0..65535"),
    (("--listen", "tcp://127.0.0.1:0", "--keys", "/nonexistent/keys"), "no key file"),
    (("--listen", "tcp://127.0.0.1:0", "--join-timeout", "0"), "seconds"),
    (("--listen", "tcp://127.0.0.1:0", "--rejoin-timeout", "nan"), "seconds"),
])
def test_listen_bad_input(args, words):
    done = cli("launch", *DEMO_ARGS, *args)
    assert done.returncode == 2, done
    assert words in done.stderr and done.stderr.count("\n") == 1, done.stderr


# -- launch --listen: runs -----------------------------------------------------------------------

LAUNCHER_ENVS = [
    {"RANK": "{r}", "WORLD_SIZE": "{n}"},
    {"SLURM_PROCID": "{r}", "SLURM_NTASKS": "{n}"},
    {"OMPI_COMM_WORLD_RANK": "{r}", "OMPI_COMM_WORLD_SIZE": "{n}"},
    {"PMI_RANK": "{r}", "PMI_SIZE": "{n}"},
]


def launcher_env(r: int, n: int) -> tuple[dict, list[str]]:
    """Rank r's environment as one launcher convention would set it (by rank), and extra flags."""
    if r == n - 1 and r >= len(LAUNCHER_ENVS) - 1:
        return {"JOB_COMPLETION_INDEX": str(r)}, ["--world-size", str(n)]   # a Kubernetes Job
    env = LAUNCHER_ENVS[r % len(LAUNCHER_ENVS)]
    return {k: v.format(r=r, n=n) for k, v in env.items()}, []


@pytest.mark.parametrize("use_keys", [True, False], ids=["curve", "plaintext-loopback"])
def test_listen_json_is_run_json_with_ranks_placed_by_their_launchers(tmp_path, keys, procs, use_keys):
    n = 4
    want = run_json(LONG, "--world-size", n)
    args = ["--listen", "tcp://127.0.0.1:0", "--spec", LONG, "--world-size", n, "--json",
            "--wire-log", tmp_path / "wire.jsonl"]
    if use_keys:
        args += ["--keys", keys]
    sched = Scheduler(args)
    procs.append(sched.proc)
    address = sched.listening()
    workers = []
    for r in range(n):
        env, extra = launcher_env(r, n)
        workers.append(start_worker(address, keys if use_keys else None, env=env, extra=extra))
    procs.extend(workers)
    status, out, err = sched.finish()
    assert status == 0, err
    assert out == want
    for w in workers:
        code, _ = exit_line(w, 10)
        assert code == 0
    said = [json.loads(line) for line in (tmp_path / "wire.jsonl").read_text().splitlines()]
    assert not [e for e in said if e.get("event") == "rank-lost"]


def test_listen_human_output_names_members_and_hosts(keys, procs):
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, *DEMO_ARGS, "--world-size", 2])
    procs.append(sched.proc)
    address = sched.listening()
    listening = sched.err.lines[0]
    assert f"--connect {address} --keys {keys} --rank R --world-size 2" in listening
    workers = [start_worker(address, keys, r, 2) for r in range(2)]
    procs.extend(workers)
    status, out, err = sched.finish()
    assert status == 0, err
    text = "\n".join(out)
    assert "2 ranks joined in" in text and "CURVE-authenticated" in text
    assert f"0: pid {workers[0].pid} at 127.0.0.1" in text
    assert f"{workers[1].pid}@127.0.0.1" in text                        # the rank table
    assert "we started none" in text
    for w in workers:
        code, line = exit_line(w, 10)
        assert code == 0 and "rank" in line and "from --rank" in line


def test_ranks_that_never_join_are_named(keys, procs):
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, *DEMO_ARGS, "--world-size", 3,
                       "--join-timeout", 4])
    procs.append(sched.proc)
    address = sched.listening()
    w = start_worker(address, keys, 0, 3)
    procs.append(w)
    status, out, err = sched.finish(30)
    assert status == 1
    assert any("ranks 1, 2 never joined within 4 s" in line for line in err), err
    code, line = exit_line(w, 10)                # the one that came is told to go
    assert code == 0, line


def test_refused_peers_are_logged_and_the_run_is_unaffected(tmp_path, keys, procs):
    """A key not in DIR, rank 1's key claiming rank 2, and a plaintext peer are all refused
    (each worker exits 1 saying why) and noted; then the real ranks run the exact trace."""
    n = 3
    want = run_json(LONG, "--world-size", n)
    log = tmp_path / "wire.jsonl"
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", LONG,
                       "--world-size", n, "--json", "--wire-log", log])
    procs.append(sched.proc)
    address = sched.listening()

    foreign = tmp_path / "foreign"
    write_keys(foreign, n)
    shutil.copy(keys / "scheduler.key", foreign / "scheduler.key")     # the right server, wrong key
    posing = tmp_path / "posing"
    posing.mkdir()
    shutil.copy(keys / "scheduler.key", posing / "scheduler.key")
    shutil.copy(keys / "rank-1.key_secret", posing / "rank-2.key_secret")   # rank 1 poses as 2
    bad = {"foreign key": start_worker(address, foreign, 1, n),
           "posing": start_worker(address, posing, 2, n),
           "plaintext": start_worker(address, None, 0, n)}
    procs.extend(bad.values())
    lines = {name: exit_line(p, 15) for name, p in bad.items()}
    assert all(code == 1 for code, _ in lines.values()), lines
    assert "refused this worker's key" in lines["foreign key"][1]
    assert "claims rank 2 but holds the key of rank 1" in lines["posing"][1]
    assert "CURVE" in lines["plaintext"][1] and "--keys" in lines["plaintext"][1]

    workers = [start_worker(address, keys, r, n) for r in range(n)]
    procs.extend(workers)
    status, out, err = sched.finish()
    assert status == 0, err
    assert out == want
    notes = [e["text"] for e in map(json.loads, log.read_text().splitlines()) if e.get("event") == "note"]
    assert any("none of this run's rank keys" in t for t in notes), notes
    assert any("claims rank 2 but holds the key of rank 1" in t for t in notes), notes
    assert any("handshake failed" in t and "plaintext peer" in t for t in notes), notes


def test_workers_leave_within_5_s_when_the_listen_scheduler_is_killed(tmp_path, keys, procs):
    spec = long_spec(tmp_path)
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", spec,
                       "--world-size", 2, "--fault", "all:delay@0+:0.01"])
    procs.append(sched.proc)
    address = sched.listening()
    workers = [start_worker(address, keys, r, 2) for r in range(2)]
    procs.extend(workers)
    sched.out.until(r"^\s+5\s", 30)                   # mid-run
    sched.kill()
    for w in workers:
        code, line = exit_line(w, 5)
        assert code == 1 and "scheduler" in line, line


@pytest.mark.parametrize("rung", ["full", "overlap"])
@pytest.mark.parametrize("policy", ["restore", "recompute"])
def test_a_lost_rank_is_replaced_by_a_worker_that_joins(tmp_path, keys, procs, policy, rung):
    """Rank 1 crashes; the scheduler waits for a replacement (started here, as a cluster's
    launcher would), then goes on in epoch 1: restore gives the same trace, recompute the
    same summary. At `overlap` the next step's plan is in flight when it crashes."""
    n = 2
    want = run_json(LONG, "--world-size", n, "--rung", rung)
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", LONG, "--rung", rung,
                       "--world-size", n, "--json", "--on-rank-loss", policy,
                       "--fault", "1:crash@3", "--rejoin-timeout", 20])
    procs.append(sched.proc)
    address = sched.listening()
    first = [start_worker(address, keys, r, n) for r in range(n)]
    procs.extend(first)
    line = sched.err.until("replacement for rank 1", 30)
    assert "--rank 1" in line
    code, _ = exit_line(first[1], 10)
    assert code == -signal.SIGKILL
    again = start_worker(address, keys, 1, n)
    procs.append(again)
    status, out, err = sched.finish()
    assert status == 0, err
    if policy == "restore":
        assert out == want
    else:
        assert json.loads(out[-1]) == json.loads(want[-1])           # the summary
    assert exit_line(again, 10)[0] == 0 and exit_line(first[0], 10)[0] == 0


def test_a_replaced_worker_that_comes_back_is_refused_and_exits(tmp_path, keys, procs):
    """Rank 1 goes quiet for 4 s (a 4-second delay: to the scheduler, as good as cut off) past
    the step deadline; a replacement joins and the run goes on. When the old worker speaks
    again it is told it was replaced, and exits; it is never joined."""
    n = 2
    spec = long_spec(tmp_path, 120, num_requests=2)
    want = run_json(spec, "--world-size", n)
    log = tmp_path / "wire.jsonl"
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", spec,
                       "--world-size", n, "--json", "--on-rank-loss", "restore",
                       "--step-timeout", 1, "--wire-log", log, "--fault", "1:delay@3:4",
                       "--fault", "all:delay@4+:0.02"])
    procs.append(sched.proc)
    address = sched.listening()
    first = [start_worker(address, keys, r, n) for r in range(n)]
    procs.extend(first)
    sched.err.until("replacement for rank 1", 30)
    again = start_worker(address, keys, 1, n)
    procs.append(again)
    code, line = exit_line(first[1], 15)
    assert code == 1 and "replaced in epoch 1" in line, line
    status, out, err = sched.finish()
    assert status == 0, err
    assert out == want
    events = [json.loads(line) for line in log.read_text().splitlines()]
    notes = [e.get("text", "") for e in events if e.get("event") == "note"]
    assert any("rank 1 of epoch 0 was replaced" in t for t in notes), notes
    assert [e["ranks"] for e in events if e.get("event") == "restart"] == [[1]]


def test_workers_leave_within_5_s_when_the_scheduler_goes_silent(tmp_path, keys, procs):
    """A scheduler that stops answering (SIGSTOP here: not even its I/O thread runs; a dead
    host, a frozen VM) is as good as gone: every member it did not start leaves on its own."""
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", long_spec(tmp_path),
                       "--world-size", 2, "--fault", "all:delay@0+:0.01"])
    procs.append(sched.proc)
    address = sched.listening()
    workers = [start_worker(address, keys, r, 2) for r in range(2)]
    procs.extend(workers)
    sched.out.until(r"^\s+5\s", 30)
    os.kill(sched.proc.pid, signal.SIGSTOP)
    try:
        for w in workers:
            code, line = exit_line(w, 6.5)
            assert code == 1 and "lost the connection" in line, line
    finally:
        os.kill(sched.proc.pid, signal.SIGCONT)
    status, _, err = sched.finish(30)
    assert status == 1 and any("rank" in line for line in err), err


def test_listen_with_timeline_audit_and_a_hang(tmp_path, keys, procs):
    """The rest of launch is as with spawned workers: a hung member (alive, deaf) is lost at the
    deadline and replaced; the timeline and the periodic audit work; the hung worker, told it
    was replaced, leaves."""
    n = 2
    want = run_json(LONG, "--world-size", n)
    timeline = tmp_path / "timeline.json"
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", LONG,
                       "--world-size", n, "--json", "--on-rank-loss", "restore", "--step-timeout", 1,
                       "--fault", "0:hang@4", "--audit-every", 2, "--timeline", timeline])
    procs.append(sched.proc)
    address = sched.listening()
    first = [start_worker(address, keys, r, n) for r in range(n)]
    procs.extend(first)
    sched.err.until("replacement for rank 0", 30)
    again = start_worker(address, keys, 0, n)
    procs.append(again)
    status, out, err = sched.finish()
    assert status == 0, err
    assert out == want
    code, line = exit_line(first[0], 10)
    assert code == 1 and "refused" in line, line
    events = json.loads(timeline.read_text())["traceEvents"]
    assert any("restore" in e.get("name", "") for e in events)


def test_the_membership_modules_import_one_way():
    """Inside the scheduler: channel <- handshake <- group, channel <- members <- group: no cycle."""
    import ast
    src = REPO / "inferris_dist" / "scheduler"

    def imports(name: str) -> set[str]:
        tree = ast.parse((src / f"{name}.py").read_text())
        return {node.module.rsplit(".", 1)[-1] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module and node.module.startswith("inferris_dist.scheduler.")}

    assert not imports("channel") & {"handshake", "members", "group", "recovery"}
    assert not imports("handshake") & {"members", "group", "recovery"}
    assert not imports("members") & {"handshake", "group", "recovery"}
    assert not imports("gate") & {"channel", "handshake", "members", "group"}


def test_a_replacement_started_early_knocks_until_it_is_let_in(tmp_path, keys, procs):
    """A cluster launcher may restart a rank before the scheduler has noticed the loss: the
    new worker repeats its HELLO until the scheduler waits for it, and is then admitted."""
    n = 2
    want = run_json(LONG, "--world-size", n)
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", LONG,
                       "--world-size", n, "--json", "--on-rank-loss", "restore", "--step-timeout", 2,
                       "--fault", "1:hang@3"])
    procs.append(sched.proc)
    address = sched.listening()
    first = [start_worker(address, keys, r, n) for r in range(n)]
    procs.extend(first)
    sched.out.until(r'"step": 1\b', 30)
    early = start_worker(address, keys, 1, n)            # rank 1 still holds its place
    procs.append(early)
    status, out, err = sched.finish()
    assert status == 0, err
    assert out == want
    assert exit_line(early, 10)[0] == 0
    code, line = exit_line(first[1], 10)
    assert code == 1 and "replaced" in line, line


def test_a_member_gone_before_ready_does_not_sink_the_join(tmp_path, keys, procs):
    """A holder of rank 0's key says HELLO and hangs up: the scheduler notes it and keeps
    waiting; the real rank 0 then joins and the run is the run."""
    import zmq

    from inferris_dist.protocol import wire
    from inferris_dist.protocol.keys import ClientKeys
    from inferris_dist.protocol.wire import MsgType
    n = 2
    want = run_json(LONG, "--world-size", n)
    log = tmp_path / "wire.jsonl"
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", LONG,
                       "--world-size", n, "--json", "--wire-log", log])
    procs.append(sched.proc)
    address = sched.listening()
    ctx = zmq.Context()
    try:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 1000)
        ClientKeys.load(keys, 0).apply(s)
        s.connect(address)
        s.send_multipart([wire.encode_header(MsgType.HELLO, 0, 0, 0, n),
                          wire.encode_body(MsgType.HELLO, wire.Hello(1, b""))])
        assert s.poll(10_000), "no CONFIG for the first HELLO"
        assert wire.decode_header(s.recv_multipart()[0]).type is MsgType.CONFIG
        s.close()                                        # gone before READY
    finally:
        ctx.term()
    workers = [start_worker(address, keys, r, n) for r in range(n)]
    procs.extend(workers)
    status, out, err = sched.finish()
    assert status == 0, err
    assert out == want
    notes = [e.get("text", "") for e in map(json.loads, log.read_text().splitlines())
             if e.get("event") == "note"]
    assert any("rank 0 left during its handshake" in t for t in notes), notes


def test_a_stalled_scheduler_main_thread_keeps_its_members(tmp_path, keys, procs):
    """Nobody reads the scheduler's output for 6 s (a paused terminal, `| less`): its main
    thread blocks, but the transport's heartbeats are answered by its I/O thread, so no member
    leaves; once read, the run ends as usual."""
    spec = long_spec(tmp_path, 100, num_requests=2)
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--keys", keys, "--spec", spec,
                       "--world-size", 2, "--wire-log", "/dev/stdout"])
    procs.append(sched.proc)
    address = sched.listening()
    workers = [start_worker(address, keys, r, 2) for r in range(2)]
    procs.extend(workers)
    import select
    select.select([], [], [], 6.0)                       # not reading: the pipe fills, the run blocks
    assert all(w.poll() is None for w in workers), "a member left while the scheduler was blocked"
    status, out, err = sched.finish()
    assert status == 0, err
    for w in workers:
        assert exit_line(w, 10)[0] == 0


@pytest.mark.parametrize("args,words", [
    (("--connect", "tcp://a b:5", "--rank", "0", "--world-size", "1"), "not a host"),
    (("--connect", "tcp://127.0.0.1:0", "--rank", "0", "--world-size", "1"), "1..65535"),
])
def test_worker_bad_addresses_are_bad_input(args, words):
    done = cli("worker", *args)
    assert done.returncode == 2 and words in done.stderr and done.stderr.count("\n") == 1, done


def test_a_key_that_is_not_z85_is_bad_input(tmp_path, keys):
    text = (keys / "rank-0.key_secret").read_text()
    secret = text.split('secret-key = "')[1][:40]
    (keys / "rank-0.key_secret").write_text(text.replace(secret, "~" * 40))
    done = cli("worker", "--connect", "tcp://127.0.0.1:9", "--keys", keys, "--rank", "0", "--world-size", "2")
    assert done.returncode == 2 and "rank-0.key_secret" in done.stderr and "Traceback" not in done.stderr
    pub = (keys / "rank-1.key").read_text()
    key = pub.split('public-key = "')[1][:40]
    (keys / "rank-1.key").write_text(pub.replace(key, "~" * 40))
    done = cli("launch", "--listen", "tcp://127.0.0.1:0", "--keys", keys, *DEMO_ARGS, "--world-size", 2)
    assert done.returncode == 2 and "rank-1.key" in done.stderr, done.stderr
