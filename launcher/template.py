"""A template process: imports a worker module once, then forks fresh workers from itself.

Starting a Python worker costs an interpreter and its imports (~60 ms of CPU
each, on every start and restart); forking a process that has already done
both costs a few milliseconds. The template is never the scheduler (which
holds state, sockets and threads): it is a small process of its own that
imported exactly the worker module and nothing else, with no thread and no
ZeroMQ context when it forks.

    python -m inferris_dist.launcher.template MODULE FD [--death-signal]   # FD: its end of a socketpair

One JSON line per message on the socketpair. The scheduler asks
`{"fork": ARGV, "rank": R, "secret": HEX, "log": PATH}`; the template answers
`{"pid": PID, "rank": R}` and, whenever a child exits, `{"exit": PID,
"status": WAITSTATUS}` (it reaps its children; the scheduler watches each
through a pidfd). `{"kill": PID}` kills a child of its own, no answer (a pid
that is no child of its, long reaped or never one, is left alone). A forked
child starts its own session, reads the secret on stdin, writes stderr to its
log, and runs `MODULE.main(ARGV)`. The template
dies with the scheduler (parent-death signal and a pidfd on it), and its
children with it.

A command line that starts workers can instead fork itself into the template as it starts
(`fork_template`), before it has imported anything but itself: no second interpreter to
start, and the template's imports run on the other core while the command reads its flags.
"""
from __future__ import annotations

import os
import signal
import socket
import sys

WORKER_MODULE = "inferris_dist.rank.cli"   # what a rank worker runs (its main(argv))


def _die_with_parent(death_signal: bool) -> int:
    """A pidfd on the parent (watched in the loop); with `death_signal`, also let the kernel
    kill us with it. That signal follows the parent's *thread* that started us, so the
    scheduler asks for it only when starting us from its main thread."""
    if death_signal:
        import ctypes
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    parent = os.getppid()
    try:
        return os.pidfd_open(parent)
    except (OSError, AttributeError):
        return -1


def _child(module, argv: list[str], secret: str, log: str, keep: list[int]) -> None:
    """In the forked child: a fresh session, the secret on stdin, stderr to the log; run."""
    code = 1
    try:
        os.setsid()
        for fd in keep:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        r, w = os.pipe()
        os.write(w, secret.encode() + b"\n")
        os.close(w)
        _streams(r, os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        sys.argv = [module.__name__, *argv]
        try:
            code = module.main(argv) or 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:       # anything else: last words, then out
        _leave(code, "template child", e)
    _leave(code)


def _streams(stdin_fd: int, log_fd: int) -> None:
    """A forked process's standard streams: stdin from `stdin_fd`, stdout to nowhere, stderr
    to `log_fd` (both descriptors taken over), and sys's streams on them."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd, std in ((stdin_fd, 0), (null, 1), (log_fd, 2)):
        os.dup2(fd, std)
        os.close(fd)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False, buffering=1)


def _leave(code: int, who: str = "", error: BaseException | None = None) -> None:
    """Out of a forked process, with last words in its log for an error: never back into the
    code it was forked from (no exit handler of that code runs, no buffer of it is flushed)."""
    if error is not None:
        try:
            os.write(2, f"{who}: {type(error).__name__}: {error}\n".encode())
        except OSError:
            pass
    try:
        sys.stderr.flush()
    except Exception:
        pass
    os._exit(code)


def fork_template(module_name: str, log_path: str) -> tuple[int, socket.socket]:
    """Fork this process into a template for `module_name`: (its pid, our end of the
    socketpair). Only for a process with one thread and no ZeroMQ context yet (a command line
    as it starts): the child is a copy of it. The child starts a session of its own (Ctrl-C at
    the terminal is the scheduler's to handle), writes its stderr to `log_path`, serves, and
    leaves with os._exit: nothing of the command line's runs in it (no exit handler, no flush
    of the parent's buffers)."""
    ours, theirs = socket.socketpair()
    log = None
    try:
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        pid = os.fork()
    except BaseException:
        ours.close()
        theirs.close()
        if log is not None:
            os.close(log)
        raise
    if pid:
        theirs.close()
        os.close(log)
        return pid, ours
    try:
        os.setsid()
        ours.close()
        _streams(os.open(os.devnull, os.O_RDONLY), log)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        fd = theirs.detach()
        os.closerange(3, fd)          # nothing else of the command line's: its run directory's
        os.closerange(fd + 1, 1 << 20)   # lock above all (held, it would keep a dead run "alive")
        serve(module_name, fd, True)
    except BaseException as e:
        _leave(0, "template", e)
    _leave(0)


def serve(module_name: str, fd: int, death_signal: bool) -> None:
    import importlib
    import json
    import select
    module = importlib.import_module(module_name)           # the one import every child shares
    prepare = getattr(module, "prepare", None)
    if prepare is not None:
        prepare()                        # what every child would do first (the module says what)
    sock = socket.socket(fileno=fd)
    parent_fd = _die_with_parent(death_signal)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    pending = b""                        # the start of an ask whose newline has not come yet

    def say(message: dict) -> None:
        sock.sendall((json.dumps(message) + "\n").encode())

    say({"ready": os.getpid()})
    children: set[int] = set()
    watch = [sock, wake_r] + ([parent_fd] if parent_fd >= 0 else [])
    try:
        while True:
            ready, _, _ = select.select(watch, [], [])
            if parent_fd in ready:
                return
            if wake_r in ready:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
                try:
                    _reap(children, say)
                except OSError:                              # the scheduler closed its end
                    return
            if sock in ready:
                try:
                    chunk = sock.recv(65536)
                except OSError:              # closed with our exit notes unread: a reset
                    chunk = b""
                if not chunk:
                    return                                   # the scheduler closed its end
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:           # several asks may come at once: each is forked
                    ask = json.loads(line)
                    if "kill" in ask:        # a child of ours the scheduler has no use for
                        if ask["kill"] in children:
                            os.kill(ask["kill"], signal.SIGKILL)
                        continue
                    pid = os.fork()
                    if pid == 0:
                        _child(module, ask["fork"], ask["secret"], ask["log"],
                               [fd, wake_r, wake_w] + ([parent_fd] if parent_fd >= 0 else []))
                    children.add(pid)
                    try:
                        say({"pid": pid, "rank": ask["rank"]})
                    except OSError:                          # the scheduler closed its end
                        return
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while True:                  # reap every child before going: no zombie outlives us
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break


def _reap(children: set[int], say) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        say({"exit": pid, "status": status})


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), "--death-signal" in sys.argv[3:])
    sys.stderr.flush()
    os._exit(0)          # its children reaped: nothing left to tear down that the scheduler waits for
