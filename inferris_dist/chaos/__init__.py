"""Chaos: fault schedules drawn from a seed, run on real processes, judged, and a break shrunk
to a reproducer (`inferris-dist chaos`, docs/chaos.md). schedules.py draws them, harness.py runs
each with one shared worker template and judges it (verdicts.py: the break classes),
exploring.py counts and shards, shrinking.py shrinks a break and writes its reproducer. Runs on
the control plane and judges by judge/; the command line is its glue.
"""
from inferris_dist.chaos.exploring import ChaosConfig, Report, explore, merge_reports, schedule_at
from inferris_dist.chaos.harness import WIRE_LOG_CHECKERS, Outcome, Session
from inferris_dist.chaos.runs import Run, run_on_processes
from inferris_dist.chaos.schedules import Schedule, draw_faults, fault_kinds, random_workloads
from inferris_dist.chaos.shrinking import Reproducer, Shrunk, shrink, write_reproducer
from inferris_dist.chaos.verdicts import Break, Reference, judge_promise, judge_run, reference_of

__all__ = ["WIRE_LOG_CHECKERS", "Break", "ChaosConfig", "Outcome", "Reference", "Report", "Reproducer", "Run",
           "Schedule", "Session", "Shrunk", "draw_faults", "explore", "fault_kinds", "judge_promise",
           "judge_run", "merge_reports", "random_workloads", "reference_of", "run_on_processes",
           "schedule_at", "shrink", "write_reproducer"]
