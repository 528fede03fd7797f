"""The console script `inferris-dist` (and `python -m inferris_dist.cli`): Ctrl-C is quiet from
its first line. Until the command line's own handling begins (main() turns an interrupt into
one line and status 130, its processes stopped), importing it can take a few tens of
milliseconds, and an interrupt then would print Python's traceback: here it prints the same
one line and leaves with 130 (nothing has been started yet). Only the interpreter's own start,
before any of our code runs, is left to Python.
"""
import os
import signal


def _interrupted_early(signum, frame) -> None:
    os.write(2, b"inferris-dist: interrupted\n")
    os._exit(130)


def entry() -> None:
    signal.signal(signal.SIGINT, _interrupted_early)
    from inferris_dist.cli.main import entry as run
    signal.signal(signal.SIGINT, signal.default_int_handler)   # from here on, main()'s to handle
    run()
