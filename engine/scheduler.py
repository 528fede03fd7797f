"""Continuous batching, the token budget and chunked prefill (SPEC §3, phases 1, 3, 4).

Requests join the running batch the step they arrive (admit) and leave it the
step they finish; each step a fresh budget of `max_step_tokens` is handed out
in request order, `min(remaining, budget)` each, so a long prompt is
prefilled in chunks over several steps while decodes keep going.

Every RUNNING request has `remaining >= 1`, so the budget is spent on the
first requests in order and the loop stops there: a step costs what it
schedules, not what is waiting.
"""
from __future__ import annotations

import bisect
import heapq

from . import speculation
from .request import Request, State


def _order(req: Request) -> int:
    return req.index


class Scheduler:
    def __init__(self, requests: list[Request]):
        self._waiting = [(r.arrival_step, r.index, r) for r in requests]
        heapq.heapify(self._waiting)
        self.running: list[Request] = []         # RUNNING, in request order

    def admit(self, step: int) -> list[Request]:
        """Phase 1: every WAITING request with arrival_step <= step, in request order."""
        arrived = []
        waiting = self._waiting
        while waiting and waiting[0][0] <= step:
            arrived.append(heapq.heappop(waiting)[2])
        arrived.sort(key=_order)
        for req in arrived:
            req.state = State.RUNNING
            bisect.insort(self.running, req, key=_order)
        return arrived

    def unadmit(self, requests: list[Request]) -> None:
        """Overlap: a step planned ahead is withdrawn (a recompute); what it admitted waits again."""
        for req in requests:
            req.state = State.WAITING
            del self.running[bisect.bisect_left(self.running, req.index, key=_order)]
            heapq.heappush(self._waiting, (req.arrival_step, req.index, req))

    def next_arrival(self) -> float:
        """The earliest arrival_step still WAITING (infinity when none is)."""
        return self._waiting[0][0] if self._waiting else float("inf")

    def schedule(self, max_step_tokens: int, spec_len: int) -> list[tuple[Request, int, bool]]:
        """Phases 3 and 4: drafts, then the budget; the work as (request, tokens, decode).

        A request the budget does not reach keeps a stale draft_len; it is set
        again before it is next read, so only reached requests are drafted.
        """
        budget = max_step_tokens
        work = []
        for req in self.running:
            decode = speculation.is_decoding(req)
            req.draft_len = speculation.draft_len(req, spec_len, decode)
            n = min(req.prompt + req.generated - req.computed + req.draft_len, budget)
            if n > 0:
                work.append((req, n, decode))
                budget -= n
                if budget == 0:
                    break
        return work

    # -- the budget as it stood before chunked prefill (the ladder's rungs 00 to 03) --

    def schedule_all(self, max_step_tokens: int, spec_len: int) -> list[tuple[Request, int, bool]]:
        """Rungs 00 and 01: no budget; every RUNNING request computes all it owes."""
        work = []
        for req in self.running:
            req.draft_len = 0
            work.append((req, req.prompt + req.generated - req.computed, speculation.is_decoding(req)))
        return work

    def schedule_whole(self, max_step_tokens: int, spec_len: int) -> list[tuple[Request, int, bool]]:
        """Rungs 02 and 03: in request order, a request runs only if all it owes fits the
        budget left; one that does not waits (and may never fit: NeverFits)."""
        budget = max_step_tokens
        work = []
        for req in self.running:
            req.draft_len = 0
            n = req.prompt + req.generated - req.computed
            if n <= budget:
                work.append((req, n, speculation.is_decoding(req)))
                budget -= n
        return work

    def retire(self, req: Request) -> None:
        """A finished request leaves the batch."""
        del self.running[bisect.bisect_left(self.running, req.index, key=_order)]
