"""The Node.js worker of examples/worker-js, written from docs/protocol.md alone, takes ranks in a
`launch --listen` run: the trace is byte for byte `run --json`'s, at world sizes 1, 2 and 4, at
rung `overlap`, under audits and through a restore. A scheduler played by the test checks what the
worker sends and how it exits on what it receives (protocol §3.4, §8.2, §9)."""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import shutil
import struct
import subprocess
import time

import pytest

from inferris_dist.protocol import wire

from tests.helpers.external import CLI, ENV, GOLDEN, REPO, Scheduler, exit_line, run_json, stop_all

WORKER_DIR = REPO / "examples" / "worker-js"
NODE = shutil.which("node")

pytestmark = [
    pytest.mark.skipif(NODE is None, reason="node is not installed"),
    pytest.mark.skipif(not (WORKER_DIR / "node_modules").is_dir(),
                       reason="examples/worker-js/node_modules is missing: run `npm ci` there"),
]


def node_worker(address: str, rank: int, world_size: int, *extra) -> subprocess.Popen:
    """One Node worker, started as someone else starts it: no secret (standard input at its end)."""
    return subprocess.Popen([NODE, str(WORKER_DIR / "worker.js"), "--connect", address, "--rank", str(rank),
                             "--world-size", str(world_size), *map(str, extra)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@contextlib.contextmanager
def listening(spec, world_size: int, *args):
    """A `launch --listen --json` scheduler of a workload, once it listens: (the scheduler, its
    address, a list for the workers the test starts). Everything is stopped at the end."""
    sched = Scheduler(["--listen", "tcp://127.0.0.1:0", "--world-size", world_size, "--json", "--spec", spec,
                       *args])
    workers: list[subprocess.Popen] = []
    try:
        yield sched, sched.listening(), workers
    finally:
        sched.kill()
        stop_all(workers)


def trace_of(sched: Scheduler) -> list[str]:
    """The scheduler's stdout once it ended, with status 0."""
    status, out, err = sched.finish(60)
    assert status == 0, err[-10:]
    return out


def launch_with_node(spec, world_size: int, *args) -> list[str]:
    """`launch --listen --json` of a workload with Node workers: its trace; every worker left with 0."""
    with listening(spec, world_size, *args) as (sched, address, workers):
        workers += [node_worker(address, r, world_size) for r in range(world_size)]
        out = trace_of(sched)
        for w in workers:
            assert exit_line(w, 10) == (0, "")
        return out


GOLDEN_SAMPLE = [("demo", 1), ("speculative", 1), ("preemption", 2), ("cache_eviction", 2),
                 ("prefix_reuse", 2), ("random_001", 4), ("continuous_batching", 4), ("spec_budget_cut", 4)]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("name", "world_size"), GOLDEN_SAMPLE)
def test_golden_trace_with_node_workers_is_run_json(name, world_size):
    spec = GOLDEN / f"{name}.spec.json"
    out = launch_with_node(spec, world_size)
    assert out == run_json(spec, "--world-size", world_size)


@pytest.mark.timeout(90)
def test_overlap_items_planned_ahead_run_where_they_belong():
    spec = GOLDEN / "speculative.spec.json"
    out = launch_with_node(spec, 2, "--rung", "overlap")
    assert out == run_json(spec, "--world-size", 2, "--rung", "overlap")


@pytest.mark.timeout(90)
def test_audits_every_step_find_the_node_shards_whole(tmp_path):
    spec = GOLDEN / "random_002.spec.json"
    log = tmp_path / "wire.jsonl"
    out = launch_with_node(spec, 2, "--audit-every", 1, "--wire-log", log)
    assert out == run_json(spec, "--world-size", 2)
    text = log.read_text()
    assert '"type": "SHARD"' in text and "audit-failed" not in text


@pytest.mark.timeout(120)
def test_a_crash_acted_out_by_the_node_worker_is_restored_from_the_pool():
    spec = GOLDEN / "demo.spec.json"
    with listening(spec, 2, "--fault", "1:crash@3", "--on-rank-loss", "restore") as (sched, address, workers):
        workers += [node_worker(address, r, 2) for r in range(2)]
        status, last = exit_line(workers[1], 30)
        assert status == -9 and "crashes" in last
        sched.err.until(r"waiting up to \d+ s for a replacement for rank 1", 30)
        workers.append(node_worker(address, 1, 2))
        assert trace_of(sched) == run_json(spec, "--world-size", 2)


# ---------------------------------------------------------------------------------------------
# The test as the scheduler: a ROUTER that speaks the protocol's version to one Node worker.

class FakeScheduler:
    """A ROUTER bound on loopback, sending and receiving whole messages with deadlines."""

    def __init__(self):
        import zmq
        self.zmq = zmq
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.linger = 0
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.peer = b""

    def recv(self, timeout: float = 10) -> list[bytes]:
        if not self.sock.poll(int(timeout * 1000)):
            pytest.fail(f"the worker sent nothing within {timeout} s")
        self.peer, *frames = self.sock.recv_multipart()
        return frames

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart([self.peer, *frames])

    def close(self) -> None:
        """Closes the socket and the context (again: nothing)."""
        if self.sock is not None:
            self.sock.close(0)
            self.ctx.term()
            self.sock = self.ctx = None


def pack(value) -> bytes:
    import msgpack
    return msgpack.packb(value, use_bin_type=True)


def unpack(frame: bytes):
    import msgpack
    return msgpack.unpackb(frame, raw=False, strict_map_key=False)


def header(kind: int, epoch: int = 0, step: int = 0, rank: int = 0, world_size: int = 1) -> bytes:
    return pack([wire.PROTOCOL_VERSION, kind, epoch, step, rank, world_size])


def i32(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}i", *values)


@pytest.fixture
def configured():
    """A Node worker of rank 0 of 1, admitted: HELLO received, CONFIG sent, READY received."""
    fake = FakeScheduler()
    worker = node_worker(fake.address, 0, 1)
    try:
        hello = fake.recv()
        assert unpack(hello[0]) == [wire.PROTOCOL_VERSION, 1, 0, 0, 0, 1]
        assert unpack(hello[1])[1] == b""
        fake.send(header(2), pack([8, 4, {"a": [1, 0, 2, 1], "__proto__": [0]}, [], [], [0, 0]]))
        ready = fake.recv()
        while ready[0] == hello[0]:                    # HELLO again, sent before CONFIG came
            ready = fake.recv()
        assert ready == [header(3), b"\x90"]
        yield fake, worker
    finally:
        stop_all([worker])
        fake.close()


@pytest.mark.timeout(60)
def test_results_shards_and_duplicates_as_the_protocol_says(configured):
    fake, worker = configured
    plan = pack([1, ["a", "b", "__proto__"],
                 i32(5, 0, 0, 3, 3, 2, 2, 0, 2, 1, 0, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0), i32(1, 2, 3)])
    fake.send(header(4, step=1), plan, b"t")
    result = fake.recv()
    assert result[:2] == [header(5, step=1), pack([["a", "b", "__proto__"],
                                                   i32(5, 0, 0, 3, 3, 2, 1, 0, 0, 1, 1, 1), i32(1, 2, 3)])]
    times = unpack(result[2])
    assert len(times) == 4 and all(isinstance(t, float) for t in times) and times == sorted(times)
    fake.send(header(4, step=1), plan)                 # the same (epoch, step): ignored
    fake.send(header(6, step=1), b"\x90")
    shard = fake.recv()
    assert shard[0] == header(7, step=1)
    assert unpack(shard[1]) == [[1, [["a", 4, b"\x0e"]]], [2, [["b", 0, b"\x07"]]],
                                [3, [["__proto__", 0, b"\x03"]]]]
    fake.send(header(4, epoch=1, step=1), pack([1, [], b"", b""]))   # a new epoch: answered
    assert fake.recv() == [header(5, epoch=1, step=1), bytes.fromhex("9390c400c400")]
    fake.send(header(8, epoch=1), b"\x90")
    assert exit_line(worker, 10) == (0, "")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("frames", "status"), [
    ([header(9), pack(["go away"])], 1),
    ([pack([4, 6, 0, 1, 0, 1]), b"\x90"], 3),                     # another protocol version
    ([header(6), b"\x90", b"t"], 3),                              # a third frame on an AUDIT
    ([header(4), pack([0, ["a"], i32(0, 1, 0, 0, 0, 1, 0), i32(8)])], 3),   # page 8 of 8 pages
    ([header(4), pack([0, ["a"], i32(0, -1, 0, 0, 0, 0, 0), b""])], 3),     # a negative column
    ([header(4), b"\x94\x00\x90\xc7\x00\x01\xc4\x00"], 3),            # an ext in a PLAN
    ([header(2, rank=1), pack([8, 4, {}, [], [], [0, 0]])], 3),   # a CONFIG again for rank 1 of 1
    ([header(3), b"\x90"], 3),                                     # READY: the worker's own word
])
def test_exit_status_on_what_the_scheduler_sends(configured, frames, status):
    fake, worker = configured
    fake.send(*frames)
    got, last = exit_line(worker, 10)
    assert got == status, last
    assert last.startswith("worker-js rank 0: ")


@pytest.mark.timeout(60)
def test_a_closed_connection_ends_the_worker(configured):
    fake, worker = configured
    started = time.monotonic()
    fake.close()
    got, last = exit_line(worker, 10)
    assert got == 1 and "closed" in last
    assert time.monotonic() - started < 5


@pytest.mark.timeout(60)
def test_a_worker_given_the_run_secret_proves_it_in_hello():
    fake = FakeScheduler()
    secret = bytes(range(32))
    worker = subprocess.Popen([NODE, str(WORKER_DIR / "worker.js"), "--rank", "1", "--world-size", "2",
                               "--connect", fake.address],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        worker.stdin.write(secret.hex().encode() + b"\n")
        worker.stdin.close()
        hello = fake.recv()
        assert unpack(hello[0]) == [wire.PROTOCOL_VERSION, 1, 0, 0, 1, 2]
        pid, proof = unpack(hello[1])
        assert pid == worker.pid
        text = f"inferris-dist hello v{wire.PROTOCOL_VERSION} rank=1 world=2 pid={pid}".encode()
        assert proof == hmac.new(secret, text, hashlib.sha256).digest()
        fake.send(pack([wire.PROTOCOL_VERSION, 9, 0, 0, -1, 2]),
                  pack(["claims rank 1 from pid 1, not the worker we started"]))
        assert exit_line(worker, 10) == (1, "worker-js rank 1: refused by the scheduler")
    finally:
        stop_all([worker])
        fake.close()


@pytest.mark.timeout(60)
def test_a_line_on_standard_input_that_is_not_a_secret_is_refused():
    done = subprocess.run([NODE, str(WORKER_DIR / "worker.js"), "--connect", "tcp://127.0.0.1:9",
                           "--rank", "0", "--world-size", "1"],
                          input=b"not hex\n", capture_output=True, timeout=30)
    assert done.returncode == 3
    assert b"not hexadecimal" in done.stderr


@pytest.mark.timeout(60)
def test_a_frame_over_64_mib_closes_the_connection(configured):
    fake, worker = configured
    fake.send(header(6), b"\x90" * (64 * 1024 * 1024 + 1))
    got, last = exit_line(worker, 10)
    assert got == 1 and "closed" in last


@pytest.mark.timeout(120)
def test_curve_keys_admit_node_workers_and_a_plaintext_one_is_turned_away(tmp_path):
    keys = tmp_path / "keys"
    done = subprocess.run([*CLI, "keys", keys, "--world-size", "2"], capture_output=True, env=ENV, timeout=60)
    assert done.returncode == 0, done.stderr
    spec = GOLDEN / "demo.spec.json"
    with listening(spec, 2, "--keys", keys) as (sched, address, workers):
        workers.append(node_worker(address, 1, 2))              # no keys: never gets in
        status, last = exit_line(workers[0], 20)
        assert status == 1 and "handshake failed" in last
        workers += [node_worker(address, r, 2, "--keys", keys) for r in range(2)]
        assert trace_of(sched) == run_json(spec, "--world-size", 2)


CONFORM_TEMPLATE = "node {script} --connect {{connect}} --rank {{rank}} --world-size {{world_size}}"


def conform_on(script, *args: str) -> subprocess.CompletedProcess:
    env = {**ENV, "NODE_PATH": str(WORKER_DIR / "node_modules")}    # a copy elsewhere finds the packages
    command = CONFORM_TEMPLATE.format(script=script)
    return subprocess.run([*CLI, "conform", "--worker", command, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=150)


@pytest.mark.procs
@pytest.mark.timeout(180)
def test_conform_passes_the_node_worker_and_catches_a_broken_copy(tmp_path):
    """The Node worker passes every required case of the conformance kit; a copy of it that
    reports one draft more accepted than its script says is caught by the golden cases of
    workloads that speculate."""
    done = conform_on(WORKER_DIR / "worker.js")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " 0 failed" in done.stdout
    source = (WORKER_DIR / "worker.js").read_text()
    honest = "out.push({ rid, start, n, accepted, pages });"
    assert source.count(honest) == 1
    broken = tmp_path / "worker.js"
    lie = "out.push({ rid, start, n, accepted: accepted + (n > 1 ? 1 : 0), pages });"
    broken.write_text(source.replace(honest, lie))
    done = conform_on(broken, "--case", "golden.speculative.*", "--case", "golden.spec_budget_cut.*",
                      "--case", "golden.demo.*", "--case", "golden.prefix_reuse.*")   # drafts, and none
    assert done.returncode == 1, done.stdout[-3000:]
    failed = [line for line in done.stdout.splitlines() if " FAIL " in line]
    assert failed and all(line.startswith("golden.") for line in failed), done.stdout
