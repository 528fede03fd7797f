"""A stand-in worker for the template tests (`external.stand_in_template`): says it has its
secret, then waits to be killed."""
import sys
import time


def main(argv):
    secret = sys.stdin.readline().strip()
    sys.stderr.write(f"rank {argv[0]} has {bytes.fromhex(secret).decode()}\n")
    sys.stderr.flush()
    time.sleep(60)
    return 0
