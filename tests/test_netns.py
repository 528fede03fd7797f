"""Tests of tests/helpers/netns.py itself: hosts reach each other, a partition cuts a host
off and healing restores it, and closing leaves no namespace or process behind."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.helpers.netns import NETNS_SKIP, Hosts
from tests.helpers.procs import gone, wait_until

pytestmark = [pytest.mark.procs, 
    pytest.mark.skipif(NETNS_SKIP is not None, reason=NETNS_SKIP or ""),
    pytest.mark.timeout(30),
]

# Listen on argv[1], print "ready PORT", accept once ("once") or forever.
LISTEN = """
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen()
print("ready", s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    c.close()
    if sys.argv[2] == "once":
        print("accepted", flush=True)
        break
"""

# Connect to argv[1]:argv[2] within argv[3] s; print what happened.
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("failed", type(e).__name__, e)
"""


def listen(hosts: Hosts, name: str, mode: str) -> tuple[subprocess.Popen, int]:
    """A listener on `name`'s address; returns once it says it is ready."""
    proc = hosts.popen(name, [sys.executable, "-c", LISTEN, hosts.addr(name), mode],
                       stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()  # blocks until bound and listening
    assert line[:1] == ["ready"], line
    return proc, int(line[1])


def connect(hosts: Hosts, src: str, addr: str, port: int, timeout: float = 2.0) -> str:
    out = hosts.run(src, [sys.executable, "-c", CONNECT, addr, str(port), str(timeout)])
    return out.stdout.strip() or out.stderr.strip()


def test_hosts_reach_hub_and_each_other():
    with Hosts(["hub", "a", "b"]) as hosts:
        assert [hosts.addr(n) for n in ("hub", "a", "b")] == ["192.0.2.1", "192.0.2.2", "192.0.2.3"]
        # Nothing listens on the hub: a refusal proves its address answered.
        assert connect(hosts, "a", hosts.addr("hub"), 9) == "refused"
        proc, port = listen(hosts, "b", "once")
        assert connect(hosts, "a", "192.0.2.3", port) == "connected"
        assert proc.stdout.readline().strip() == "accepted"
        assert proc.wait(timeout=5) == 0
        proc.stdout.close()


def test_link_down_partitions_and_link_up_heals():
    with Hosts(["hub", "a", "b"]) as hosts:
        proc, port = listen(hosts, "a", "forever")
        assert connect(hosts, "b", hosts.addr("a"), port) == "connected"

        hosts.link_down("a")
        start = time.monotonic()
        outcome = connect(hosts, "b", hosts.addr("a"), port, timeout=2.0)
        assert outcome.startswith("failed"), outcome
        assert time.monotonic() - start < 5

        hosts.link_up("a")
        assert wait_until(lambda: connect(hosts, "b", hosts.addr("a"), port) == "connected", 10, 0.1)
        assert proc.poll() is None  # the partition did not touch the process
        proc.stdout.close()


# Start a grandchild in a new session (not our child, so only `ip netns pids`
# can find it), print both pids, then wait forever.
SPAWN = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_close_deletes_namespaces_and_kills_processes():
    with Hosts(["hub", "a", "b"]) as hosts:
        names = list(hosts.ns.values())
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert all(ns in listed for ns in names)
        proc = hosts.popen("a", [sys.executable, "-c", SPAWN], stdout=subprocess.PIPE, text=True)
        grandchild = int(proc.stdout.readline())
        assert wait_until(lambda: {proc.pid, grandchild} <= set(hosts.pids("a")), 5)
        hosts.popen("b", [sys.executable, "-c", "import time; time.sleep(600)"])
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in names)
    assert all(gone(p.pid) for p in hosts._procs) and gone(grandchild)
    proc.stdout.close()
    hosts.close()  # idempotent
