"""The wire between the two sides, and what both sides share: typed msgpack messages with a
version and bounded decoding (wire), CURVE keys (keys), the fault grammar and how each fault is
acted out (faults), where a rank comes from (placement), and the limits both sides apply
(limits, args). Imports nothing of the scheduler, the rank, observation or the command line.
"""
