"""Hostile surroundings: what the project does when its inputs, its clients and its address are
not what a careful user would give it.

1. every loopback form keeps the live server's Host check, IPv4 mapped into IPv6 included, and
   none of them is warned about as reachable from other machines;
2. --max-restarts has a cap, as every other budget flag does: past it, one line and exit 2;
3. a step line is summarised only when it would not fit: COLUMNS, where set, is the width, on a
   pipe too.
"""
from __future__ import annotations

import socket
import subprocess

import pytest

from inferris_dist.protocol.placement import is_loopback_host
from inferris_dist.scheduler.options import is_loopback as is_loopback_listen

from tests.helpers.external import CLI, ENV, REPO, Lines

pytestmark = [pytest.mark.timeout(60)]


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("localhost", True),
    ("::ffff:127.0.0.1", True), ("::ffff:127.9.9.9", True),
    ("0.0.0.0", False), ("::", False), ("::ffff:192.0.2.1", False), ("192.0.2.1", False),
    ("example.com", False), ("", False)])
def test_every_loopback_form_is_loopback(host, loopback):
    assert is_loopback_host(host) is loopback
    bracketed = f"[{host}]" if ":" in host else host
    assert is_loopback_listen(f"tcp://{bracketed}:5555") is loopback


def _raw(port: int, host_header: bytes) -> bytes:
    with socket.socket(socket.AF_INET6) as s:
        s.settimeout(5)
        s.connect(("::ffff:127.0.0.1", port))
        s.sendall(b"GET /status HTTP/1.1\r\nHost: " + host_header + b"\r\n\r\n")
        out = b""
        while chunk := s.recv(4096):
            out += chunk
        return out


@pytest.mark.procs
def test_an_ipv4_mapped_loopback_address_keeps_the_host_check(tmp_path):
    log = tmp_path / "w.log"
    done = subprocess.run([*CLI, "launch", "--wire-log", str(log)], cwd=REPO, env=ENV, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 0, done.stderr
    serve = subprocess.Popen([*CLI, "serve", str(log), "--address", "[::ffff:127.0.0.1]:0"], cwd=REPO,
                             env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL)
    try:
        err = Lines(serve.stderr)
        said = err.until(r"serving .* at http://", 20)
        port = int(said.split(" at http://", 1)[1].split("/", 1)[0].rpartition(":")[2])
        assert _raw(port, b"evil.example").startswith(b"HTTP/1.1 403")
        assert _raw(port, b"127.0.0.1").startswith(b"HTTP/1.1 200")
    finally:
        serve.terminate()
        serve.wait(10)
    rest = serve.stderr.read().decode()
    assert "reachable from other machines" not in said + rest


@pytest.mark.parametrize("command", [["launch"], ["compare"], ["chaos", "--runs", "1"]])
def test_max_restarts_has_a_cap(command):
    done = subprocess.run([*CLI, *command, "--max-restarts", "1000000000000"], cwd=REPO, env=ENV,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "100000" in lines[0] and "max-restarts" in lines[0], lines


def test_a_step_line_is_summarised_only_when_it_would_not_fit():
    spec = str(REPO / "tests" / "data" / "golden" / "eos_immediate.spec.json")

    def first_step(columns: str | None) -> str:
        env = {k: v for k, v in ENV.items() if k != "COLUMNS"}
        if columns is not None:
            env["COLUMNS"] = columns
        done = subprocess.run([*CLI, "run", "--rung", "overlap", "--spec", spec], cwd=REPO, env=env,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()[1]
    wide = first_step("200")
    assert "admit mute one" in wide and "run mute:4 one:2" in wide and len(wide) > 100, wide
    assert "admit 2  run 2 (6 tok)" in first_step(None)           # a pipe: 100 columns
    assert first_step("60").startswith("    0  admit 2  run 2 (6 tok)")
