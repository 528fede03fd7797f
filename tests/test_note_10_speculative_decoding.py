"""Note 10, speculative decoding (docs/mechanisms/10-speculative-decoding.md): its invariants
speculative-decoding/1 to /5, pinned by checking every step's drafts, verdicts and rollbacks."""
from __future__ import annotations

import pytest
from hypothesis import given

from inferris_dist.engine import Engine, State, pages_needed, trace_dicts, verdict
from inferris_dist.engine.rungs import CACHE_FIELDS

from tests.helpers.external import golden_workload
from tests.helpers.invariants import (
    GOLDEN_NAMES,
    PROPERTY,
    Step,
    as_workload,
    plan_steps,
    prefix_workloads,
)

pytestmark = pytest.mark.timeout(60)


def spec_len_of(eng):
    return eng.config.spec_len if eng.rung.speculation else 0


class SpecChecker:
    def __init__(self, workload):
        self.scripts = {r.request_id: r.accept_script for r in as_workload(workload).requests}
        self.verdicts: dict[str, int] = {}

    def draft_rule(self, s: Step) -> None:
        eng = s.eng
        for item in s.prepared.plan.items:
            req = eng.by_id[item.request_id]
            gen = s.before.generated[item.request_id]
            decoding = gen >= 1 and item.start_position == req.prompt + gen - 1
            assert item.decode == decoding, item
            want = min(spec_len_of(eng), req.max_new_tokens - gen - 1) if decoding else 0
            assert item.draft_len == want, item
            assert 1 <= item.num_tokens <= req.prompt + gen - item.start_position + item.draft_len

    def accounting(self, s: Step) -> None:
        t = s.trace
        decode_ids = [i.request_id for i in s.prepared.plan.items if i.decode]
        assert list(t.drafted) == list(t.accepted) == list(t.rolled_back) == decode_ids
        for item in s.prepared.plan.items:
            rid = item.request_id
            if not item.decode:
                continue
            d, a, rb = t.drafted[rid], t.accepted[rid], t.rolled_back[rid]
            assert d == item.num_tokens - 1 and 0 <= a <= d and rb == d - a
            assert s.after.computed[rid] == item.start_position + item.num_tokens - rb
            sampled_token = t.sampled.get(rid) == "TOKEN"
            assert s.after.generated[rid] == s.before.generated[rid] + a + sampled_token

    def verdict_rule(self, s: Step) -> None:
        for item in s.prepared.plan.items:
            rid = item.request_id
            if not item.decode:
                continue
            assert item.verdict_index == self.verdicts.get(rid, 0)
            req = s.eng.by_id[rid]
            want = verdict(self.scripts[rid], item.verdict_index, item.num_tokens - 1)
            if req.eos_after is not None:
                want = min(want, req.eos_after - s.before.generated[rid])
            assert s.trace.accepted[rid] == want
            self.verdicts[rid] = item.verdict_index + 1

    def rollback_frees(self, s: Step) -> None:
        ps = s.eng.config.page_size
        for rid, table in s.after.tables.items():
            if s.after.state[rid] is State.RUNNING:
                assert len(table) == pages_needed(s.after.computed[rid], ps)
        for item in s.prepared.plan.items:
            rid = item.request_id
            if item.decode and s.trace.rolled_back[rid] and s.after.state[rid] is State.RUNNING:
                dropped = s.mid.tables[rid][len(s.after.tables[rid]):]
                for p in dropped:
                    assert s.after.owner[p] is None and p in s.after.free

    def no_overshoot(self, s: Step) -> None:
        for r in s.eng.requests:
            assert r.draft_len >= 0
            assert r.generated <= r.max_new_tokens
            if r.eos_after is not None:
                assert r.generated <= r.eos_after

    def all(self, s: Step) -> None:
        self.draft_rule(s)
        self.accounting(s)
        self.verdict_rule(s)
        self.rollback_frees(s)
        self.no_overshoot(s)


def final_generated_ok(eng):
    for r in eng.requests:
        if r.state is State.FINISHED:
            cap = r.max_new_tokens if r.eos_after is None else min(r.max_new_tokens, r.eos_after)
            assert r.generated == cap
            assert str(r.finish_reason) == ("EOS" if r.eos_after is not None
                                            and r.eos_after < r.max_new_tokens else "LENGTH")


def check_spec_run(workload, rung="full"):
    checker = SpecChecker(workload)
    eng = None
    for s in plan_steps(workload, rung):
        checker.all(s)
        eng = s.eng
    if eng is not None:
        final_generated_ok(eng)


SPEC_GOLDENS = [n for n in GOLDEN_NAMES if golden_workload(n).config.spec_len > 0]


@pytest.mark.invariant("speculative-decoding/1")
@pytest.mark.invariant("speculative-decoding/2")
@pytest.mark.invariant("speculative-decoding/3")
@pytest.mark.invariant("speculative-decoding/4")
@pytest.mark.invariant("speculative-decoding/5")
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_speculation_on_golden_workloads(name):
    check_spec_run(golden_workload(name))


@pytest.mark.invariant("speculative-decoding/1")
@pytest.mark.invariant("speculative-decoding/2")
@pytest.mark.invariant("speculative-decoding/3")
@pytest.mark.invariant("speculative-decoding/4")
@pytest.mark.invariant("speculative-decoding/5")
@PROPERTY
@given(wl=prefix_workloads())
def test_speculation_on_generated_workloads(wl):
    check_spec_run(wl)


@pytest.mark.invariant("speculative-decoding/1")
def test_no_drafts_below_full():
    for rung in ("05", "08c"):
        for s in plan_steps(golden_workload("speculative"), rung):
            assert all(i.draft_len == 0 for i in s.prepared.plan.items)


@pytest.mark.invariant("speculative-decoding/1")
def test_recompute_after_preemption_is_not_a_window():
    # SPEC §5: step 8 of recompute_window recomputes 15 positions of q6 with no verdict
    checker = SpecChecker(golden_workload("recompute_window"))
    seen = False
    for s in plan_steps(golden_workload("recompute_window")):
        checker.draft_rule(s)
        if s.step == 8:
            item = next(i for i in s.prepared.plan.items if i.request_id == "q6")
            assert item.num_tokens == 15 and not item.decode and item.draft_len == 0
            seen = True
    assert seen


@pytest.mark.invariant("speculative-decoding/5")
@pytest.mark.parametrize("name", SPEC_GOLDENS + ["demo", "preemption"])
def test_speculation_changes_no_summary(name):
    wl = golden_workload(name)
    with_drafts, without = trace_dicts(Engine(wl, rung="full")), trace_dicts(Engine(wl, rung="08c"))
    if "summary" in with_drafts[-1] and "summary" in without[-1]:
        assert with_drafts[-1] == without[-1]
    # and with spec_len 0 the full engine is the 08c engine, field for field
    plain = trace_dicts(Engine(wl.with_config(spec_len=0), rung="full"))
    assert [{k: line[k] for k in CACHE_FIELDS} if "step" in line else line for line in plain] == \
        trace_dicts(Engine(wl.with_config(spec_len=0), rung="08c"))
