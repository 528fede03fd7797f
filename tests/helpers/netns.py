"""Test hosts as Linux network namespaces.

Its part: give a test several "machines" on one box, each with its own network
stack and address, so the distributed engine runs across real addresses, and a
host can be cut off from the network (link_down) and joined again (link_up).

    from tests.helpers.netns import Hosts, needs_netns

    @needs_netns
    def test_x():
        with Hosts(["sched", "a", "b"]) as hosts:
            p = hosts.popen("a", [sys.executable, "-c", "..."], stdout=subprocess.PIPE)
            hosts.link_down("a"); ...; hosts.link_up("a")

or `hosts = hosts_fixture(["sched", "a", "b"])` at module level for a fixture. A program
outside the tests runs `python -m tests.helpers.netns NAME...` from the repository's root
(see `main`).
The first name is the hub: it holds bridge br0 at 192.0.2.1/24; the i-th name
sits at 192.0.2.(i+1)/24 behind a veth pair into the bridge.  192.0.2.0/24 is
TEST-NET-1 (RFC 5737), and it is configured only inside the namespaces: every
veth is created directly in them, so the root namespace is never touched.
"""
from __future__ import annotations

import atexit
import functools
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers.procs import gone, wait_until

NET = "192.0.2"
BRIDGE = "br0"
HOST_IF = "eth0"  # inside each host namespace, so the short name cannot clash
_counter = itertools.count()
_live: set["Hosts"] = set()  # open Hosts, closed by atexit if a run crashes


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


@functools.cache
def netns_skip_reason() -> str | None:
    """Why namespaces cannot be made here (one line), or None; probed once."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "needs root to make network namespaces"
    if shutil.which("ip") is None:
        return "`ip netns` not available: install iproute2"
    probe = f"inf-probe-{os.getpid()}"  # one add + del: cheap, and proves both
    try:
        made = _ip("netns", "add", probe, check=False)
        if made.returncode == 0:
            _ip("netns", "del", probe)
            return None
        err = (made.stderr or made.stdout).strip().splitlines()
        return f"`ip netns add` failed: {err[0] if err else made.returncode}"
    except (OSError, subprocess.SubprocessError, RuntimeError) as e:
        return f"`ip netns` probe failed: {e}"


def __getattr__(name: str):
    # Module attributes computed on first use (PEP 562), so importing this
    # module costs nothing until a test asks whether namespaces work.
    if name == "NETNS_SKIP":
        return netns_skip_reason()
    if name == "needs_netns":
        reason = netns_skip_reason()
        return pytest.mark.skipif(reason is not None, reason=reason or "")
    raise AttributeError(name)


class Hosts:
    """One network namespace per name, joined by a bridge in the first (hub)."""

    def __init__(self, names: list[str]):
        names = list(names)
        if not names or len(set(names)) != len(names) or len(names) > 253:
            raise ValueError(f"need 1..253 distinct host names, got {names}")
        for name in names:
            if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                raise ValueError(f"host name {name!r}: use letters, digits, _ and -")
        self.names = names
        self.hub = names[0]
        n = next(_counter)
        self.ns = {name: f"inf-{os.getpid()}-{n}-{name}" for name in names}
        self._procs: list[subprocess.Popen] = []
        self._made: list[str] = []  # namespaces that exist, for cleanup
        _live.add(self)
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        for name in self.names:
            _ip("netns", "add", self.ns[name])
            self._made.append(self.ns[name])
            _ip("-n", self.ns[name], "link", "set", "lo", "up")
        hub = self.ns[self.hub]
        # STP off and no forward delay: a port that comes up forwards at once.
        _ip("-n", hub, "link", "add", BRIDGE, "type", "bridge",
            "stp_state", "0", "forward_delay", "0")
        _ip("-n", hub, "addr", "add", f"{self.addr(self.hub)}/24", "dev", BRIDGE)
        _ip("-n", hub, "link", "set", BRIDGE, "up")
        for i, name in enumerate(self.names[1:], start=1):
            # Both ends are born inside namespaces (hub end here, peer straight
            # into the host), so no interface ever exists in the root namespace.
            _ip("-n", hub, "link", "add", f"p{i}", "type", "veth",
                "peer", "name", HOST_IF, "netns", self.ns[name])
            _ip("-n", hub, "link", "set", f"p{i}", "master", BRIDGE, "up")
            _ip("-n", self.ns[name], "addr", "add", f"{self.addr(name)}/24", "dev", HOST_IF)
            _ip("-n", self.ns[name], "link", "set", HOST_IF, "up")
        for name in self.names[1:]:
            self.wait_reachable(self.hub, name)

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def addr(self, name: str) -> str:
        return f"{NET}.{self.names.index(name) + 1}"

    def argv(self, name: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns[name], *argv]

    def popen(self, name: str, argv: list[str], **popen_kwargs) -> subprocess.Popen:
        # `ip netns exec` execs argv in place, so proc.pid is the program's pid.
        proc = subprocess.Popen(self.argv(name, argv), **popen_kwargs)
        self._procs.append(proc)
        return proc

    def run(self, name: str, argv: list[str], timeout: float = 10, **kw) -> subprocess.CompletedProcess:
        kw = {"capture_output": True, "text": True, **kw}
        return subprocess.run(self.argv(name, argv), check=False, timeout=timeout, **kw)

    def pids(self, name: str) -> list[int]:
        return self._ns_pids(self.ns[name])

    def _dev(self, name: str) -> str:
        # The hub's own link is its bridge: taking it down cuts off everyone.
        return BRIDGE if name == self.hub else HOST_IF

    def link_down(self, name: str) -> None:
        """Partition `name` from every other host; its address stays configured."""
        _ip("-n", self.ns[name], "link", "set", self._dev(name), "down")

    def link_up(self, name: str, timeout: float = 5.0) -> None:
        """Undo link_down, and wait until the network reaches `name` again."""
        ns, dev, addr = self.ns[name], self._dev(name), self.addr(name)
        _ip("-n", ns, "link", "set", dev, "up")
        # The kernel keeps IPv4 addresses on a down link and re-adds their
        # prefix routes on up; check anyway, since connectivity depends on it.
        if f"inet {addr}/" not in _ip("-n", ns, "-4", "addr", "show", "dev", dev).stdout:
            _ip("-n", ns, "addr", "replace", f"{addr}/24", "dev", dev)
        if not _ip("-n", ns, "-4", "route", "show", f"{NET}.0/24").stdout.strip():
            _ip("-n", ns, "route", "replace", f"{NET}.0/24", "dev", dev, "src", addr)
        for other in self.names:
            if other != name and (name == self.hub or other == self.hub):
                self.wait_reachable(other, name, timeout)

    # A TCP connect to a closed port: "refused" proves the address answered.
    _PROBE = ("import socket,sys\ns=socket.socket();s.settimeout(1)\n"
              "try: s.connect((sys.argv[1],9))\n"
              "except ConnectionRefusedError: pass\n"
              "except OSError: sys.exit(1)\n")

    def wait_reachable(self, src: str, dst: str, timeout: float = 5.0) -> None:
        """Wait until dst's address answers from src; TimeoutError if it does not."""
        probe = [sys.executable, "-c", self._PROBE, self.addr(dst)]
        if not wait_until(lambda: self.run(src, probe).returncode == 0, timeout, 0.05):
            raise TimeoutError(f"{dst} ({self.addr(dst)}) unreachable from {src} in {timeout}s")

    def close(self, timeout: float = 5.0) -> None:
        """Kill everything in the namespaces, then delete them. Idempotent; never raises."""
        deadline = time.monotonic() + timeout
        try:
            for proc in self._procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
            # Loop: a process may fork between listing and killing.
            def empty() -> bool:
                pids = [p for ns in self._made for p in self._ns_pids(ns)]
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                return all(gone(p) for p in pids)
            wait_until(empty, max(0.0, deadline - time.monotonic()), 0.05)
            for proc in self._procs:  # reap our children, bounded
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except Exception:
                    pass
        except Exception as e:
            print(f"netns: cleanup of processes failed: {e}", file=sys.stderr)
        # Deleting a namespace destroys the veths and the bridge inside it.
        for ns in self._made[:]:
            try:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
                self._made.remove(ns)
            except Exception as e:
                print(f"netns: deleting {ns} failed: {e}", file=sys.stderr)
        _live.discard(self)

    @staticmethod
    def _ns_pids(ns: str) -> list[int]:
        try:
            out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                 text=True, timeout=10).stdout
            return [int(p) for p in out.split()]
        except Exception:
            return []


def hosts_fixture(names: list[str]):
    """A pytest fixture giving a Hosts on `names`: `hosts = hosts_fixture([...])`."""
    @pytest.fixture
    def _hosts():
        if netns_skip_reason():
            pytest.skip(netns_skip_reason())
        with Hosts(names) as hosts:
            yield hosts
    return _hosts


@atexit.register
def _close_all() -> None:
    for hosts in list(_live):
        hosts.close()


def main(names: list[str]) -> int:
    """`python -m tests.helpers.netns NAME...`, from the repository's root: the hosts NAME...
    for a program outside the tests (examples/bench_hosts.py). Prints one JSON line, {"skip":
    reason} where namespaces cannot be made, else {"addr": {name: address}, "argv": {name:
    prefix}} (`prefix + argv` runs argv on that host), and keeps the hosts until its stdin
    closes; then removes them."""
    reason = netns_skip_reason()
    if reason is not None:
        print(json.dumps({"skip": reason}), flush=True)
        return 0
    with Hosts(names) as hosts:
        print(json.dumps({"addr": {n: hosts.addr(n) for n in hosts.names},
                          "argv": {n: hosts.argv(n, []) for n in hosts.names}}), flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
