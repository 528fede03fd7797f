"""The transport floor's worker: unpack each plan with msgpack, answer with a
reply of the size a real rank's result has, no engine. Used by bench_boundary.py.
"""
import os
import sys

import msgpack
import zmq


def main() -> None:
    address, parent = sys.argv[1], int(sys.argv[2])
    sys.stdin.readline()                       # the launcher's secret line; unused here
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 1000)
    sock.connect(address)
    sock.send(b"hello")
    while True:
        try:
            frames = sock.recv_multipart()
        except zmq.Again:
            if os.getppid() != parent:
                return
            continue
        if frames[0] == b"stop":
            return
        plan = msgpack.unpackb(frames[1], use_list=False)
        reply_len = msgpack.unpackb(frames[0])
        sock.send_multipart([frames[0], msgpack.packb((plan[0], b"x" * reply_len))])


if __name__ == "__main__":
    main()
