"""Losing a link across hosts, for real: the kernel's own faults on a veth pair between network
namespaces (192.0.2.0/24, only inside them), the scheduler on one host (`launch --listen`,
CURVE), rank 0 on a second and rank 1 on a third, whose link is the one that fails.

ZeroMQ runs over TCP, which retransmits: what the kernel does to packets reaches the run as
a message late, or as no message at all. Each fault is bounded in time, and undone in
`finally` (the namespaces are deleted by tests/helpers/netns.py):

- the link down both ways (`ip link set eth0 down`): under abort the run fails at the step
  deadline naming rank 1 alone ("gave no answer", reason timeout), measured from the link
  going down to the `rank-lost` event; under restore a replacement joins from the same
  host once the link is back, the old worker is told it was replaced, and the trace is the
  in-process one;
- the link down for less than the deadline: TCP rides it out, nothing is lost;
- one way only (a qdisc on one side that drops everything it would send: `prio` with a
  `matchall` filter and a drop action where the kernel has them, else the `blackhole`
  qdisc): results lost, or plans lost; rank 1 alone is blamed;
- a starved link (`tbf` rate and queue limits): slow within the deadline changes nothing;
  slower than a step can bear is a loss at the deadline;
- `netem` delay, loss and reorder, where the kernel has netem (skipped with the kernel's
  answer otherwise).

Every wait is on a condition with a deadline (the scheduler's --json lines, its standard
error, a socket's send queue); no bare sleep. The figures (detection times, round trips on a
slow link) are printed: `pytest -s tests/test_netns_link.py`. Skipped with the reason where
namespaces cannot be made (not root, no iproute2).
"""
from __future__ import annotations

import json
import re
import select
import shutil
import time
from pathlib import Path

import pytest

from tests.helpers.external import Scheduler, exit_line, keys_for, long_spec, run_json, start_worker, stop_all
from tests.helpers.netns import NETNS_SKIP, Hosts
from tests.helpers.procs import wait_until

pytestmark = [pytest.mark.procs, pytest.mark.timeout(90),
              pytest.mark.skipif(NETNS_SKIP is not None, reason=NETNS_SKIP or "")]

STEP_TIMEOUT = 1.0
SLOW = "all:delay@0+:0.02"       # each step about 20 ms: the run lasts a few seconds
NAMES = ["sched", "a", "b"]      # rank 0 on a, rank 1 on b: b's link is the one that fails
CUT, CUT_DEV = "b", "eth0"       # b's own end of its link
HUB_DEV = "p2"                   # the hub's end of b's link (the i-th host's is p<i>)


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> tuple[Path, list[str]]:
    """A two-request workload of about 110 steps, and its trace from `run --json`."""
    spec = long_spec(tmp_path_factory.mktemp("spec"), 100, num_requests=2, max_step_tokens=8)
    return spec, run_json(spec, "--world-size", 2)


class Run:
    """The scheduler on host sched, its two ranks on a and b; the wire log in `log`."""

    def __init__(self, hosts: Hosts, tmp_path: Path, spec: Path, *args):
        self.hosts, self.log = hosts, tmp_path / "wire.jsonl"
        self.keys = keys_for(tmp_path, 2)
        self.sched = Scheduler(["--listen", f"tcp://{hosts.addr('sched')}:0", "--keys", self.keys,
                                "--spec", spec, "--world-size", 2, "--json", "--fault", SLOW,
                                "--wire-log", self.log, *args], prefix=hosts.argv("sched", []))
        self.procs = [self.sched.proc]
        self.address = self.sched.listening()
        self.workers = [self.worker(0, "a"), self.worker(1, CUT)]

    def worker(self, rank: int, host: str):
        w = start_worker(self.address, self.keys, rank, 2, prefix=self.hosts.argv(host, []))
        self.procs.append(w)
        return w

    def at_step(self, k: int) -> int:
        """Wait until step k is committed; the last step committed by then (lines come in batches)."""
        self.sched.out.until(rf'^\{{"step": {k},', 30)
        return self.progress()

    def progress(self) -> int:
        """The last step committed now: every line the scheduler has written so far, read."""
        out = self.sched.out
        while not out.eof and select.select([out.fd], [], [], 0)[0]:
            out.pump(0)
        return max(json.loads(line)["step"] for line in out.lines if line.startswith('{"step"'))

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def lost(self) -> list[dict]:
        return [r for r in self.records() if r.get("event") == "rank-lost"]

    def rtts(self, rank: int) -> dict[int, float]:
        return {r["step"]: r["rtt"] for r in self.records()
                if r.get("type") == "RESULT" and r.get("rank") == rank and "rtt" in r and r["epoch"] == 0}


def ip_run(hosts: Hosts, host: str, *argv: str) -> tuple[int, str]:
    done = hosts.run(host, list(argv))
    return done.returncode, (done.stderr or done.stdout).strip()


def assert_lost_alone(run: Run, cut_at: float, what: str) -> float:
    """rank 1 alone was lost, at the deadline, for giving no answer; seconds from the cut to it."""
    lost = run.lost()
    assert [(e["rank"], e["ranks"], e["reason"]) for e in lost] == [(1, [1], "timeout")], lost
    assert re.fullmatch(rf"rank 1 gave no answer to step \d+ within {STEP_TIMEOUT:g} s", lost[0]["message"])
    assert "died" not in lost[0]["message"]
    took = lost[0]["t"] - cut_at          # the scheduler's clock is ours: CLOCK_MONOTONIC, one per box
    print(f"\n{what}: rank 1 lost {took:.3f} s after the cut (--step-timeout {STEP_TIMEOUT:g})")
    assert STEP_TIMEOUT - 0.1 <= took <= STEP_TIMEOUT + 0.5, took
    return took


def finished(run: Run, status: int) -> list[str]:
    code, out, err = run.sched.finish(60)
    assert code == status, err[-10:]
    return out


# -- the link down: both ways ---------------------------------------------------------------------

def test_the_link_down_under_abort_names_the_cut_off_rank_alone(tmp_path, workload):
    spec, want = workload
    with Hosts(NAMES) as hosts:
        run = None
        down = False
        try:
            run = Run(hosts, tmp_path, spec, "--step-timeout", STEP_TIMEOUT)
            last = run.at_step(5)
            hosts.link_down(CUT)
            down, cut_at = True, time.monotonic()
            out = finished(run, 1)
            error = json.loads(out[-1])
            assert (error["error"], error["rank"], error["reason"]) == ("RankLost", 1, "timeout")
            assert out[:-1] == want[:len(out) - 1] and len(out) - 1 >= last + 1   # the steps before stand
            assert_lost_alone(run, cut_at, "link down both ways, abort")
            assert exit_line(run.workers[0], 10)[0] == 0        # rank 0 was told to stop, and did
        finally:
            if down:
                hosts.link_up(CUT)
            stop_all(run.procs if run is not None else [])


def test_the_link_down_under_restore_a_replacement_joins_and_the_trace_holds(tmp_path, workload):
    spec, want = workload
    with Hosts(NAMES) as hosts:
        run = None
        down = False
        try:
            run = Run(hosts, tmp_path, spec, "--step-timeout", STEP_TIMEOUT, "--on-rank-loss", "restore")
            run.at_step(5)
            hosts.link_down(CUT)
            down, cut_at = True, time.monotonic()
            run.sched.err.until(r"a replacement for rank 1\b", 30)
            hosts.link_up(CUT)                        # the host comes back; its launcher restarts rank 1
            down = False
            new = run.worker(1, CUT)
            code, line = exit_line(run.workers[1], 15)
            assert code == 1 and "replaced in epoch 1" in line, line
            assert finished(run, 0) == want
            assert_lost_alone(run, cut_at, "link down both ways, restore")
            for w in (run.workers[0], new):
                assert exit_line(w, 10)[0] == 0
            assert [r["epoch"] for r in run.records() if r.get("event") == "restart"] == [1]
        finally:
            if down:
                hosts.link_up(CUT)
            stop_all(run.procs if run is not None else [])


def test_the_link_down_for_less_than_the_deadline_is_ridden_out(tmp_path, workload):
    """Down until TCP has sent a segment to rank 1's host again (the cut lost the first), then
    up: the run goes on, nothing lost, the trace is the in-process one."""
    spec, want = workload
    deadline = 3.0                                    # room for TCP's retransmission backoff

    def retransmitted() -> int:
        """Segments the scheduler's connections to rank 1's host have sent again, in all."""
        out = hosts.run("sched", ["ss", "-tinH", "dst", hosts.addr(CUT)]).stdout
        return sum(int(n) for n in re.findall(r"\bretrans:\d+/(\d+)", out))

    if shutil.which("ss") is None:
        pytest.skip("no `ss` (iproute2) to see a send queue")
    with Hosts(NAMES) as hosts:
        run = None
        down = False
        try:
            run = Run(hosts, tmp_path, spec, "--step-timeout", deadline)
            last = run.at_step(5)
            before = retransmitted()
            hosts.link_down(CUT)
            down, cut_at = True, time.monotonic()
            assert wait_until(lambda: retransmitted() > before, 5, 0.005), "TCP sent nothing again"
            hosts.link_up(CUT)
            down, healed = False, time.monotonic()
            assert finished(run, 0) == want
            assert run.lost() == []
            rtts = run.rtts(1)
            stall = max(v for k, v in rtts.items() if k > last)
            print(f"\nlink down {healed - cut_at:.3f} s, under the deadline: ridden out, the slowest round "
                  f"trip to rank 1 {stall:.3f} s")
            assert stall < deadline
        finally:
            if down:
                hosts.link_up(CUT)
            stop_all(run.procs if run is not None else [])


# -- one way only -----------------------------------------------------------------------------

def drop_egress(hosts: Hosts, host: str, dev: str) -> tuple[list[list[str]], str]:
    """The commands that make `dev` on `host` drop everything it would send, tried here and
    undone; (commands, what they are). Skips with the kernel's answers where none works."""
    tries = [([["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "prio"],
               ["tc", "filter", "add", "dev", dev, "parent", "1:", "matchall", "action", "drop"]],
              "a prio qdisc with a matchall filter and a drop action"),
             ([["tc", "qdisc", "add", "dev", dev, "root", "blackhole"]], "the blackhole qdisc")]
    said = []
    for commands, what in tries:
        answers = [ip_run(hosts, host, *c) for c in commands]
        ip_run(hosts, host, "tc", "qdisc", "del", "dev", dev, "root")
        failed = [a for a in answers if a[0] != 0]
        if not failed:
            return commands, what
        said.append(f"{what}: {failed[0][1] or 'exit ' + str(failed[0][0])}")
    pytest.skip("no way to drop one direction here: " + "; ".join(said))


@pytest.mark.parametrize("direction", ["results", "plans"])
def test_one_way_the_cut_off_rank_is_named_alone(tmp_path, workload, direction):
    """Results: rank 1's host sends nothing (its end drops it); plans: the hub sends it
    nothing (the hub's end of its link drops it). Either way rank 1 gives no answer."""
    spec, want = workload
    host, dev = (CUT, CUT_DEV) if direction == "results" else ("sched", HUB_DEV)
    with Hosts(NAMES) as hosts:
        run = None
        applied = False
        try:
            commands, how = drop_egress(hosts, host, dev)
            run = Run(hosts, tmp_path, spec, "--step-timeout", STEP_TIMEOUT)
            run.at_step(5)
            for c in commands:
                assert ip_run(hosts, host, *c)[0] == 0
            applied, cut_at = True, time.monotonic()
            out = finished(run, 1)
            assert json.loads(out[-1])["rank"] == 1 and out[:-1] == want[:len(out) - 1]
            assert_lost_alone(run, cut_at, f"one way ({direction} dropped by {how})")
        finally:
            if applied:
                ip_run(hosts, host, "tc", "qdisc", "del", "dev", dev, "root")
            stop_all(run.procs if run is not None else [])


# -- a starved link: tbf ------------------------------------------------------------------------

def tbf(hosts: Hosts, rate: str, burst: int, limit: int) -> list[str]:
    """Rank 1's host sends at `rate`, `burst` bytes at once at most, `limit` bytes queued (the
    rest dropped)."""
    command = ["tc", "qdisc", "add", "dev", CUT_DEV, "root", "tbf", "rate", rate, "burst", str(burst),
               "limit", str(limit)]
    code, said = ip_run(hosts, CUT, *command)
    if code != 0:
        pytest.skip(f"tbf: {said}")
    return command


def test_a_slow_link_within_the_deadline_changes_nothing(tmp_path, workload):
    """16 kbit/s from rank 1's host, 600 bytes at once, for a dozen steps: each result (about
    200 bytes on the wire) waits for the bucket, and still comes in time."""
    spec, want = workload
    with Hosts(NAMES) as hosts:
        run = None
        applied = False
        try:
            run = Run(hosts, tmp_path, spec, "--step-timeout", STEP_TIMEOUT, "--on-rank-loss", "restore")
            last = run.at_step(5)
            tbf(hosts, "16kbit", 600, 3000)
            applied, last = True, run.progress()
            until = run.at_step(last + 12)
            ip_run(hosts, CUT, "tc", "qdisc", "del", "dev", CUT_DEV, "root")
            applied = False
            assert finished(run, 0) == want and run.lost() == []
            rtts = run.rtts(1)
            before = sorted(v for k, v in rtts.items() if k <= last)
            slow = sorted(v for k, v in rtts.items() if last + 6 <= k <= until - 1)   # the burst spent
            print(f"\ntbf 16kbit: rank 1's round trip {1000 * before[len(before) // 2]:.1f} ms before, "
                  f"{1000 * slow[len(slow) // 2]:.1f} ms on the slow link ({len(slow)} steps), no loss")
            assert slow and slow[len(slow) // 2] > 3 * before[len(before) // 2]
        finally:
            if applied:
                ip_run(hosts, CUT, "tc", "qdisc", "del", "dev", CUT_DEV, "root")
            stop_all(run.procs if run is not None else [])


def test_a_link_too_slow_for_a_step_is_a_loss_at_the_deadline(tmp_path, workload):
    """1 kbit/s and a one-packet queue: a result needs more than a second to leave."""
    spec, _ = workload
    with Hosts(NAMES) as hosts:
        run = None
        applied = False
        try:
            run = Run(hosts, tmp_path, spec, "--step-timeout", STEP_TIMEOUT)
            run.at_step(5)
            tbf(hosts, "1kbit", 1600, 1600)
            applied, cut_at = True, time.monotonic()
            finished(run, 1)
            took = run.lost()[0]["t"] - cut_at
            assert [(e["rank"], e["ranks"], e["reason"]) for e in run.lost()] == [(1, [1], "timeout")]
            assert "gave no answer" in run.lost()[0]["message"]
            # the step under way when the link slowed may still get through: at most one more
            print(f"\ntbf 1kbit: rank 1 lost {took:.3f} s after the link slowed")
            assert STEP_TIMEOUT - 0.1 <= took <= 2 * STEP_TIMEOUT + 0.5
        finally:
            if applied:
                ip_run(hosts, CUT, "tc", "qdisc", "del", "dev", CUT_DEV, "root")
            stop_all(run.procs if run is not None else [])


# -- netem, where the kernel has it -----------------------------------------------------------------

def test_netem_delay_loss_and_reorder_are_ridden_out(tmp_path, workload):
    spec, want = workload
    netem = ["tc", "qdisc", "add", "dev", CUT_DEV, "root", "netem", "delay", "20ms", "5ms",
             "loss", "5%", "reorder", "25%", "50%"]
    with Hosts(NAMES) as hosts:
        code, said = ip_run(hosts, CUT, *netem)
        if code != 0:
            pytest.skip(f"netem: {said}")
        ip_run(hosts, CUT, "tc", "qdisc", "del", "dev", CUT_DEV, "root")
        run = None
        applied = False
        try:
            run = Run(hosts, tmp_path, spec, "--step-timeout", 3.0, "--on-rank-loss", "restore")
            last = run.at_step(5)
            assert ip_run(hosts, CUT, *netem)[0] == 0
            applied, last = True, run.progress()
            run.at_step(last + 20)
            ip_run(hosts, CUT, "tc", "qdisc", "del", "dev", CUT_DEV, "root")
            applied = False
            assert finished(run, 0) == want and run.lost() == []
        finally:
            if applied:
                ip_run(hosts, CUT, "tc", "qdisc", "del", "dev", CUT_DEV, "root")
            stop_all(run.procs if run is not None else [])
