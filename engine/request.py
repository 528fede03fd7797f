"""A request's state (SPEC §2): WAITING -> RUNNING -> FINISHED, and its counters.

`computed` is the frontier (positions whose state is written), `generated`
the tokens sampled so far; `target = prompt + generated` and `remaining =
target - computed + draft_len` are derived, never stored.
"""
from __future__ import annotations

from enum import StrEnum

from .workload import RequestSpec


class State(StrEnum):
    WAITING = "WAITING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"


class FinishReason(StrEnum):
    LENGTH = "LENGTH"
    EOS = "EOS"


class SampleResult(StrEnum):
    TOKEN = "TOKEN"
    EOS = "EOS"


class Request:
    __slots__ = ("index", "request_id", "tokens", "prompt", "max_new_tokens", "arrival_step",
                 "eos_after", "state", "finish_reason", "generated", "computed",
                 "page_table", "draft_len", "num_verdicts", "prefix_keys", "cache_cursor",
                 "in_holders", "assumed")

    def __init__(self, index: int, spec: RequestSpec):
        self.index = index                      # position in the request list: the order of every phase
        self.request_id = spec.request_id
        self.tokens = spec.tokens
        self.prompt = len(spec.tokens)
        self.max_new_tokens = spec.max_new_tokens
        self.arrival_step = spec.arrival_step
        self.eos_after = spec.eos_after
        self.state = State.WAITING
        self.finish_reason: FinishReason | None = None
        self.generated = 0
        self.computed = 0
        self.page_table: list[int] = []
        self.draft_len = 0
        self.num_verdicts = 0                   # decode items committed: the next verdict_index
        self.prefix_keys: list[int] | None = None   # keys of complete prompt blocks, made on first use
        self.cache_cursor = None        # (node, depth): how far the cache is known to hold this prefix
        self.in_holders = False                 # queued in the engine's preemption-victim heap
        self.assumed = None     # overlap: what the step in flight is assumed to yield (overlap.Assumption)

    @property
    def target(self) -> int:
        return self.prompt + self.generated

    @property
    def remaining(self) -> int:
        return self.target - self.computed + self.draft_len

    def summary(self) -> dict:
        return {"request_id": self.request_id, "state": str(self.state), "generated": self.generated,
                "computed": self.computed,
                "finish_reason": None if self.finish_reason is None else str(self.finish_reason)}

    def __repr__(self) -> str:
        return (f"Request({self.request_id} {self.state} generated={self.generated} "
                f"computed={self.computed} pages={self.page_table})")
