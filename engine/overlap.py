"""Overlap scheduling (mechanism 13, beyond the original): plan step k+1 while step k executes.

The contract. While the ranks execute step k, the control plane prepares step
k+1 (phases 1 to 6) from what is committed through step k-1 and what step k's
plan already decided, never from step k's result. What k+1 may assume of k,
per request k scheduled (`assume`):

- its tokens: the item executes, its drafts are all accepted, and if it
  reaches its target it samples a TOKEN. Those tokens are *placeholders*; the
  pages for them were reserved when k was planned.
- a request that would then have generated `max_new_tokens` is taken as
  finished: it is not scheduled at k+1 (its draft length comes out negative,
  so the budget gives it nothing). If drafts are rejected it runs again at
  k+2; no work is wasted either way.

A verdict cannot be known when k+1 is planned, but the ranks know it when they
run k+1: an item planned after d assumed drafts carries `prior_drafts = d`,
its placements cover every start it could have, and each rank starts it as
many positions earlier as it rejected of those drafts (rank.RankExecutor.where);
the control plane learns the same number from k's result and checks the
shifted start and pages at the next commit (boundary.validate). An EOS cannot
be foreseen at all: when k's result commits (`reconcile`), a request that
finished by EOS gives its placeholders back and its item in k+1, planned from
a state that never existed, is *discarded*: the ranks execute it, nothing of
it commits. A step planned ahead never preempts (residency.AHEAD_RELIEFS), so
no request loses an item in flight to a preemption: only an EOS discards work.

Pages. A page freed while a plan in flight may still write it (the pages of
a finished, preempted or rolled-back request that k+1 placed on) is held
back from the free list until that plan has landed (PagePool.free,
plan_in_flight, plan_landed): no page is handed to anyone while a plan in
flight can write it.

In process the engine keeps exactly the order the processes keep (prepare k,
prepare k+1, commit k, prepare k+2, commit k+1, ...), so `run --rung overlap`
and `launch --rung overlap` print the same bytes. The trace adds two fields:
`discarded` (tokens of this step's items that did not commit, per request)
and `returned` (placeholders of this step given back, per request).
"""
from __future__ import annotations

from typing import NamedTuple

from .request import Request


class Assumption(NamedTuple):
    """What a request was before the step in flight, and what that step was assumed to make it."""
    computed: int
    generated: int
    num_verdicts: int
    assumed_generated: int
    drafts: int                 # the item's drafts, all assumed accepted


def assume(work: list, voided: set[str]) -> int:
    """After step k's plan went out: every item not discarded yields what it may yield at most
    (drafts all accepted, the sampled token a TOKEN). Returns how many requests are then taken
    as finished (they are still RUNNING; nothing is scheduled for them)."""
    done = 0
    for req, n, decode in work:
        if req.request_id in voided:
            continue
        computed, generated, verdicts = req.computed, req.generated, req.num_verdicts
        req.computed = computed + n
        if decode:
            req.generated = generated + n - 1
            req.num_verdicts = verdicts + 1
        if req.computed == req.prompt + req.generated:
            req.generated += 1
        req.assumed = Assumption(computed, generated, verdicts, req.generated, n - 1 if decode else 0)
        if req.generated >= req.max_new_tokens:
            done += 1
    return done


def settle(req: Request) -> Assumption:
    """Before its step commits: the request as committed, so that phases 9 to 13 run from the
    real state exactly as at `full`."""
    a = req.assumed
    req.assumed = None
    req.computed, req.generated, req.num_verdicts = a.computed, a.generated, a.num_verdicts
    return a


def reconcile(req: Request, a: Assumption) -> int:
    """After its step committed: the placeholders given back. 0 when the step yielded exactly
    what was assumed (then the request's item in the next step stands, or it finished by
    LENGTH as assumed). Otherwise `rolled_back`, plus 1 for an EOS sampled where a TOKEN was
    assumed: every rejected draft and the EOS lower `generated`, so a real state that differs
    from the assumed one always shows there."""
    return a.assumed_generated - req.generated
