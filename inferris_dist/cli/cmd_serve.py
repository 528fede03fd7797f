"""`inferris-dist serve WIRELOG` and `launch --serve`: a run watched as it runs.

`serve` follows a wire log as it is written (as `tail -f` does), from any run (`launch
--wire-log`, the library's `wire_log=`), until its end record, and serves the live page,
/metrics, /health and /status (live/server.py). After the end it says so and keeps
serving, until Ctrl-C or `--serve-linger` seconds.

`launch --serve [HOST:]PORT` binds the address before any worker starts (a bad value, a
port in use: one line, exit 2), writes the run's wire log (to a private file in a run
directory of its own when no --wire-log is given: removed after, or swept by the next run
if this one is killed), and starts `serve` on that log in a process of its own, handing it
the bound socket. The step loop gains nothing but the log it writes anyway; the server
shares no interpreter (no lock, no thread) with it. The server stops when the run has
ended and every open page has been told so, or `--serve-linger` seconds after; it dies
with the scheduler if that is killed.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from inferris_dist.cli.args import EXIT_OK, EXIT_TERMINATED
from inferris_dist.cli.flags import linger_arg
from inferris_dist.engine import WorkloadError
from inferris_dist.words import shown

PR_SET_PDEATHSIG = 1
END_SECONDS = 5.0            # the wait for the last message to reach the open pages
NICE = 10                    # launch's server: an observer, scheduled after the run's processes


def listening_socket(value: str, flag: str = "--serve") -> socket.socket:
    """The socket `value` ([HOST:]PORT) names, bound and listening, or bad input."""
    from inferris_dist.live.server import AddressError, bind, parse_address
    try:
        host, port = parse_address(value, flag)
    except AddressError as e:
        raise WorkloadError(str(e)) from None
    try:
        return bind(host, port)
    except OSError as e:
        raise WorkloadError(f"{flag} {value}: cannot listen there: {e.strerror or e}") from None


def announce(sock: socket.socket, what: str, linger: float | None) -> None:
    """Where the server is (stderr: --json stays clean), and a warning when it is reachable
    from elsewhere: nothing authenticates the page or /metrics."""
    from inferris_dist.live.server import url_of
    from inferris_dist.protocol.placement import is_loopback_host as is_loopback
    url = url_of(sock)
    after = ("it stops when the run has ended" if not linger else
             f"it stays {linger:g} s after the run ends") if linger is not None else \
        "it stays after the run ends, until Ctrl-C"
    sys.stderr.write(f"inferris-dist: serving {what} at {url} (the live page; also /metrics, /health, "
                     f"/status, /page.html); {after}\n")
    host = sock.getsockname()[0]
    if not is_loopback(host):
        sys.stderr.write(f"inferris-dist: warning: {url} is reachable from other machines, and nothing "
                         f"authenticates the page, /metrics or /status: whoever reaches it sees the run\n")
    sys.stderr.flush()


def add_arguments(srv) -> None:
    srv.add_argument("wirelog", metavar="WIRELOG", help="a wire log being written (launch --wire-log, "
                     "the library's wire_log=), or one already written")
    srv.add_argument("--address", default="127.0.0.1:0", metavar="[HOST:]PORT",
                     help="where to serve (default 127.0.0.1:0: loopback, any free port; the URL goes "
                          "to stderr)")
    srv.add_argument("--serve-linger", type=linger_arg, default=None, metavar="SECONDS",
                     help="stop this long after the run's end record (default: keep serving until Ctrl-C)")
    srv.add_argument("--title", help="the page's title (default: the run's name)")
    srv.add_argument("--fd", type=int, help=argparse.SUPPRESS)        # launch --serve: its bound socket
    srv.add_argument("--parent", type=int, help=argparse.SUPPRESS)    # launch --serve: die with it
    srv.add_argument("--control-fd", type=int, help=argparse.SUPPRESS)   # launch --serve: the desk
    srv.add_argument("--token-file", help=argparse.SUPPRESS)             # launch --serve: its token


def main(args) -> int:
    return run_serve(args)


def run_serve(args) -> int:
    """`inferris-dist serve WIRELOG` (and, with --fd, the server of a `launch --serve`)."""
    from inferris_dist.live.server import LiveServer, follow
    from inferris_dist.live.state import LiveState
    from inferris_dist.page import build_page, read_log
    from inferris_dist.protocol.placement import is_loopback_host as is_loopback
    from inferris_dist.wirelog.logread import LogFollower
    child = args.fd is not None
    if child:
        signal.signal(signal.SIGTERM, _stopped_quietly)
        _die_with(args.parent)
        try:
            os.nice(NICE)        # the run's own processes come first when the cores are busy
        except OSError:
            pass
        sock = socket.socket(fileno=args.fd)
    else:
        sock = listening_socket(args.address, "--address")
    follower = None
    try:
        follower = LogFollower(args.wirelog, "serve")
        _first_line_taken(follower)      # a log already begun is checked before anything is said
    except BaseException:
        sock.close()
        if follower is not None:
            follower.close()
        raise
    title = args.title or None
    state = LiveState(title)
    path = args.wirelog
    control = None
    if args.control_fd is not None:
        from inferris_dist.live.control import DeskLine
        control = DeskLine(socket.socket(fileno=args.control_fd), args.token_file)
    server = LiveServer(sock, state, lambda: build_page(read_log(path), title),
                        loopback=is_loopback(sock.getsockname()[0]), control=control)
    linger = args.serve_linger
    stop = threading.Event()
    server.start()
    try:
        if not child:
            announce(sock, f"{shown(path)}", linger)
        parent = args.parent
        alive = (lambda: os.getppid() == parent) if parent is not None else (lambda: True)
        ended = _follow(follower, state, stop, alive, follow)
        if not ended and not child:
            sys.stderr.write(f"inferris-dist serve: stopped following {shown(path)}: "
                             f"{state.follow_error or 'the writer is gone'}\n")
        deadline = time.monotonic() + END_SECONDS
        while ended and not server.ended_and_told() and time.monotonic() < deadline:
            time.sleep(0.02)
        if ended and not child:
            status = state.status_json()
            how = "ended (ok)" if status["status"] == "ok" else f"failed: {status['error']}"
            more = "serving until Ctrl-C" if linger is None else f"serving {linger:g} s more"
            sys.stderr.write(f"inferris-dist serve: the run {how}, {status['steps']} steps; {more}\n")
            sys.stderr.flush()
        if linger is None:
            while True:
                time.sleep(3600)
        if linger > 0:
            time.sleep(linger)
        server.stop(drain=END_SECONDS)
    finally:
        stop.set()
        server.stop()
        follower.close()
    return EXIT_OK


def _follow(follower, state, stop, alive, follow) -> bool:
    """The log's records until its end; a file whose first line is no record is not a wire log."""
    while not _first_line_taken(follower):
        if not alive() or stop.wait(0.05):
            return False
    return follow(follower, state, stop, alive)


def _first_line_taken(follower) -> bool:
    """Whether the log's first line has come (False: not yet); a first line that is no record
    (junk, a blank line, JSON of another shape, past the line's bound) is bad input."""
    from inferris_dist.wirelog.logread import decode_line
    from inferris_dist.wirelog.schema import record_kind
    pieces, size, fd = [], 0, follower.file.fileno()
    while not pieces or b"\n" not in pieces[-1] and size <= follower.max_line:
        chunk = os.pread(fd, 1 << 20, size)
        if not chunk:
            return False
        pieces.append(chunk)
        size += len(chunk)
    line = b"".join(pieces).split(b"\n", 1)[0]
    try:
        record = record_kind(decode_line(line)) if len(line) <= follower.max_line else None
    except (ValueError, RecursionError, MemoryError):
        record = None
    if record is None:
        raise WorkloadError(f"serve {follower.name}: not a wire log (its first line is no wire message "
                            f"or event)")
    return True


def _stopped_quietly(signum, frame):
    """A launch's server told to stop (its run is over, or was interrupted): the launch says
    what happened, in one line of its own; the server leaves without a word, status 143."""
    raise SystemExit(EXIT_TERMINATED)


def _die_with(parent: int | None) -> None:
    """The server of a launch dies with it (the kernel's parent-death signal; and if the
    launch is already gone, now)."""
    if parent is None:
        return
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


class LaunchServer:
    """`launch --serve`: the socket bound at once (bad input before any worker starts), the
    server started on the run's wire log once it is open, stopped when the run is over."""

    def __init__(self, value: str | None, linger: float, args=None):
        self.value = value
        self.linger = linger
        self.sock = listening_socket(value) if value is not None else None
        self.proc: subprocess.Popen | None = None
        self.run_dir = None
        self.log_ok = False          # the run's wire log was written whole (its end record too)
        self.desk = None             # --on-rank-loss pause: the operator's desk, served here
        self.control: socket.socket | None = None     # our end of the server's line to the desk
        self.token_file = None
        self._stop_desk = threading.Event()
        if self.sock is not None and getattr(args, "on_rank_loss", None) == "pause":
            from inferris_dist.scheduler.operator import Desk
            self.desk = Desk(args.pause_timeout, args.pause_default)

    @property
    def wanted(self) -> bool:
        return self.sock is not None

    def private_log(self) -> str:
        """A wire log of our own, in a private run directory (swept if we are killed)."""
        from inferris_dist.launcher import make_run_dir
        self.run_dir = make_run_dir()
        return str(self.run_dir / "wire.jsonl")

    def start(self, wire_log: str, title: str) -> None:
        fd = self.sock.fileno()
        argv = [sys.executable, "-m", "inferris_dist.cli", "serve", wire_log, "--fd", str(fd),
                "--parent", str(os.getpid()), "--serve-linger", repr(float(self.linger)), "--title", title]
        fds = [fd]
        theirs = None
        if self.desk is not None:
            from inferris_dist.scheduler.operator import serve_socket
            token = self._token()
            self.control, theirs = socket.socketpair()
            argv += ["--control-fd", str(theirs.fileno()), "--token-file", str(self.token_file)]
            fds.append(theirs.fileno())
            serve_socket(self.desk, self.control, self._stop_desk)
        try:
            self.proc = subprocess.Popen(argv, pass_fds=fds, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, start_new_session=True)
        finally:
            if theirs is not None:
                theirs.close()       # the server holds it now
        announce(self.sock, "the run", self.linger)
        if self.desk is not None:
            from inferris_dist.live.server import url_of
            url = url_of(self.sock).rstrip("/")
            sys.stderr.write(f"inferris-dist: the operator's API: {url}/fault-tolerance/status and "
                             f"POST {url}/fault-tolerance/apply, with the header "
                             f"'Authorization: Bearer {token}' (the token is also in {self.token_file}, "
                             f"mode 0600); inferris-dist ft {url} status --token-file {self.token_file}\n")
            sys.stderr.flush()
        self.sock.close()           # the server holds it now

    def _token(self) -> str:
        """The operator's bearer token: made now, written 0600 into the run directory (never
        into the wire log, the page or /status), said once on stderr."""
        import secrets

        from inferris_dist.launcher import make_run_dir
        if self.run_dir is None:
            self.run_dir = make_run_dir()
        token = secrets.token_urlsafe(32)
        self.token_file = self.run_dir / "operator-token"
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token

    def finish(self, log_ok: bool) -> None:
        """After the run (its log closed): the server says the end to its pages, lingers as
        asked, and stops; a log that broke has no end to wait for."""
        if self.proc is not None:
            if log_ok and self.linger:
                sys.stderr.write(f"inferris-dist: the run is over; the server stays {self.linger:g} s "
                                 f"(--serve-linger)\n")
                sys.stderr.flush()
            try:
                self.proc.wait(timeout=(self.linger + 2 * END_SECONDS + 2) if log_ok else 0.01)
            except subprocess.TimeoutExpired:
                pass
        self.close()

    def close(self) -> None:
        """Whatever happened: the server stopped (SIGTERM, then SIGKILL), the private log gone."""
        self._stop_desk.set()
        if self.control is not None:
            self.control.close()
            self.control = None
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=3)
        if self.sock is not None:
            self.sock.close()
        if self.run_dir is not None:
            from inferris_dist.launcher import remove_run_dir
            remove_run_dir(self.run_dir)
            self.run_dir = None
