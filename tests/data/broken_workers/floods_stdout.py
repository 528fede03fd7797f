"""Our worker, writing to stdout without end while it works."""
import os
import sys
import threading

from _base import main


def flood():
    line = b"flood " * 10_000 + b"\n"
    while True:
        try:
            os.write(1, line)
        except OSError:
            return


threading.Thread(target=flood, daemon=True).start()
sys.exit(main())
