"""The twelve mechanisms of the original design, in its order, and two beyond it: the
question each answers, the rung of the ladder that adds it, where it lives, its tests, and
its note.

`inferris-dist mechs` lists them; `inferris-dist mechs NAME` prints a note
(docs/mechanisms/NN-slug.md): the problem, the numbered invariants (each
pinned by a test marked `invariant("slug/N")`), the smallest state machine,
where it lives, what the trace shows, and two commands that make it visible.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import NamedTuple

NOTES = Path(importlib.util.find_spec("inferris_dist.notes").submodule_search_locations[0])


class Mechanism(NamedTuple):
    number: str
    slug: str
    name: str
    question: str
    rung: str
    module: str
    tests: str
    beyond: bool = False     # beyond the original design (the original ladder ends at 12)

    @property
    def note(self) -> Path:
        return NOTES / f"{self.number}-{self.slug}.md"


MECHANISMS = [
    Mechanism("01", "engine-loop", "engine loop", "What happens in one step, in what order?",
              "00", "engine/step.py", "tests/test_golden.py"),
    Mechanism("02", "continuous-batching", "continuous batching",
              "Who joins and leaves the running batch this step?",
              "01", "engine/scheduler.py", "tests/test_scheduler.py"),
    Mechanism("03", "token-budget", "token budget", "How many tokens may one step compute?",
              "02", "engine/scheduler.py", "tests/test_scheduler.py"),
    Mechanism("04", "paged-state", "paged state", "Which page and slot hold position p of a request?",
              "03", "engine/pool.py", "tests/test_pool.py"),
    Mechanism("05", "chunked-prefill", "chunked prefill",
              "How is a prompt longer than the budget split across steps?",
              "04", "engine/scheduler.py", "tests/test_scheduler.py"),
    Mechanism("06", "preemption", "preemption", "Who gives its pages back when the pool is short?",
              "05", "engine/residency.py", "tests/test_residency.py"),
    Mechanism("07", "prefix-hash", "prefix hash",
              "How is a prompt block named, with all that came before it?",
              "08a", "engine/prefix.py", "tests/test_prefix.py"),
    Mechanism("08", "radix-cache", "radix cache", "Which prompt blocks has someone computed already?",
              "08a", "engine/prefix.py", "tests/test_prefix.py"),
    Mechanism("09", "cache-aware-scheduling", "cache-aware scheduling",
              "What is reused, published, and evicted under pressure?",
              "08b", "engine/caching.py", "tests/test_caching.py"),
    Mechanism("10", "speculative-decoding", "speculative decoding",
              "How many draft tokens survive, and what rolls back?",
              "full", "engine/speculation.py", "tests/test_speculation.py"),
    Mechanism("11", "executor-boundary", "executor boundary",
              "What does the control plane check before it commits?",
              "full", "engine/boundary.py", "tests/test_boundary.py"),
    Mechanism("12", "parallelism", "parallelism", "When do N rank answers make one?",
              "full", "engine/group.py", "tests/test_group.py"),
    Mechanism("13", "overlap-scheduling", "overlap scheduling",
              "What may step k+1 assume of step k while k executes?",
              "overlap", "engine/overlap.py", "tests/test_note_13_overlap_scheduling.py", beyond=True),
    Mechanism("14", "elastic-world", "elastic world",
              "Go on without a lost rank, grow back, or wait to be told?",
              "full", "inferris_dist/scheduler/recovery.py", "tests/test_elastic.py", beyond=True),
]


def find(name: str) -> Mechanism | None:
    """By number (4, 04), slug (paged-state) or name (paged state); a unique prefix will do."""
    key = name.strip().lower().replace("_", "-")
    for m in MECHANISMS:
        if key in (m.number, m.number.lstrip("0"), m.slug, m.name.replace(" ", "-")):
            return m
    matches = [m for m in MECHANISMS if m.slug.startswith(key) or m.name.startswith(key.replace("-", " "))]
    return matches[0] if len(matches) == 1 else None
