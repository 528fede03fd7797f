"""The rank's side of the boundary: a worker process that decodes a plan, executes it into its
page shard and replies, in lockstep, until STOP. It imports only `inferris_dist.protocol` and
`inferris_dist.engine` (tests/test_layering.py checks it): a rank loads nothing of the control
plane.

    python -m inferris_dist.rank --connect tcp://HOST:PORT --keys DIR [--rank R] [--world-size N]
"""
