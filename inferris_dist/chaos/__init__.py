"""Chaos: fault schedules drawn from a seed, run on real processes, judged, and a break shrunk
to a reproducer (`inferris-dist chaos`, docs/chaos.md). schedules.py draws them, harness.py runs
each with one shared worker template and judges it (verdicts.py: the break classes),
exploring.py counts and shards, shrinking.py shrinks a break and writes its reproducer. Runs on
the control plane and judges by judge/; the command line is its glue.
"""
