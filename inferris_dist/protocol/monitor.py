"""ZeroMQ's socket monitor, as both sides read it: one event is a 16-bit id and a 32-bit value.

Parsed here rather than by pyzmq's helper, which imports asyncio (a worker pays for every
module it imports, at every start).
"""
from __future__ import annotations

import struct


def monitor_event(frames: list[bytes]) -> tuple[int, int]:
    """(event, value) of a socket monitor message."""
    if len(frames) < 1 or len(frames[0]) < 6:
        return 0, 0
    event, value = struct.unpack("=HI", frames[0][:6])
    return event, value
