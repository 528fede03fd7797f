"""The executor boundary: validate (phase 9) refuses any result that does not fit the plan,
at the first of its mismatches (which name every violation, for the history checker), and a
refused result commits nothing."""
import pytest

from inferris_dist import engine
from inferris_dist.engine import (
    BoundaryViolation,
    Engine,
    ExecutionPlan,
    ExecutionResult,
    ItemOutcome,
    LocalGroup,
    PlanItem,
    load_workload,
    run_workload,
)
from inferris_dist.engine.boundary import build_plan, mismatches, said, validate
from inferris_dist.engine.request import Request
from inferris_dist.engine.workload import RequestSpec


def placements(start, num_tokens, page_table, page_size=4):
    """The plan's placements for positions [start, start + num_tokens), in its wire form."""
    req = Request(0, RequestSpec("x", (0,), 1))
    req.computed, req.page_table = start, list(page_table)
    return build_plan(0, [(req, num_tokens, False)], page_size).items[0].placements


def spec_placements(item, page_size):
    """A plan item's SPEC placements (position, page_id, offset), whatever its wire form."""
    try:
        return engine.expand_placements(item.start_position, item.num_tokens, item.placements, page_size)
    except TypeError:
        return engine.expand_placements(item.placements)


PLACE_A = placements(2, 4, [0, 1])          # positions 2..5: pages 0 and 1
PLACE_B = placements(0, 2, [2])
PLAN = ExecutionPlan(3, (
    PlanItem("a", 2, 4, 3, True, 0, PLACE_A),          # decode: accepted may be 0..3
    PlanItem("b", 0, 2, 0, False, 0, PLACE_B),
))
GOOD = (ItemOutcome("a", 2, 4, 1, PLACE_A),
        ItemOutcome("b", 0, 2, 0, PLACE_B))


def result(*outcomes):
    return ExecutionResult(3, tuple(outcomes))


def with_field(i, **changes):
    outs = list(GOOD)
    outs[i] = outs[i]._replace(**changes)
    return result(*outs)


def test_a_fitting_result_passes():
    validate(PLAN, result(*GOOD))
    assert spec_placements(PLAN.items[0], 4) == [(2, 0, 2), (3, 0, 3), (4, 1, 0), (5, 1, 1)]
    for accepted in (0, 3):                                   # both ends of the decode range
        validate(PLAN, with_field(0, accepted=accepted))


@pytest.mark.parametrize("bad", [
    pytest.param(with_field(1, request_id="c"), id="wrong-id"),
    pytest.param(result(GOOD[1], GOOD[0]), id="order"),
    pytest.param(result(GOOD[0]), id="missing-outcome"),
    pytest.param(result(*GOOD, GOOD[1]), id="extra-outcome"),
    pytest.param(result(), id="no-outcomes"),
    pytest.param(with_field(0, start_position=3), id="start"),
    pytest.param(with_field(1, start_position=1), id="start-non-decode"),
    pytest.param(with_field(0, executed_tokens=2), id="executed-fewer"),
    pytest.param(with_field(1, executed_tokens=3), id="executed-more"),
    pytest.param(with_field(0, writes=placements(2, 2, [0, 1])), id="writes-short"),
    pytest.param(with_field(0, writes=placements(2, 4, [0, 3])), id="writes-other-page"),
    pytest.param(with_field(0, writes=placements(2, 4, [1, 0])), id="writes-pages-swapped"),
    pytest.param(with_field(1, writes=placements(0, 2, [3])), id="writes-other-page-non-decode"),
    pytest.param(with_field(1, writes=PLACE_A), id="writes-of-the-other-item"),
    pytest.param(with_field(1, writes=()), id="writes-none"),
    pytest.param(with_field(0, accepted=4), id="decode-accepted-above-drafted"),
    pytest.param(with_field(0, accepted=-1), id="decode-accepted-negative"),
    pytest.param(with_field(1, accepted=1), id="non-decode-accepted"),
    pytest.param(with_field(1, accepted=-1), id="non-decode-accepted-negative"),
])
def test_every_mismatch_is_a_boundary_violation(bad):
    with pytest.raises(BoundaryViolation):
        validate(PLAN, bad)


def test_mismatches_names_every_violation_and_validate_raises_the_first():
    bad = result(ItemOutcome("a", 3, 2, 4, PLACE_B), ItemOutcome("c", 0, 2, 0, PLACE_B))
    found = [(m.field, m.index, m.got, m.want) for m in mismatches(PLAN, bad)]
    assert found == [("start_position", 0, 3, 2), ("executed_tokens", 0, 2, 4),
                     ("writes", 0, PLACE_B, PLACE_A), ("accepted", 0, 4, 3),
                     ("request_id", 1, "c", "b")]             # an outcome for another request: that alone
    with pytest.raises(BoundaryViolation, match=r"^a: start_position 3, planned 2$"):
        validate(PLAN, bad)
    assert [said(m) for m in mismatches(PLAN, bad)][2:] == [
        f"a: wrote pages [{PLACE_B[0]}], placed on pages [{','.join(map(str, PLACE_A))}]",
        "a: accepted 4, allowed 0..3", "outcome 1 is for 'c', the plan has 'b'"]
    short = ExecutionResult(4, GOOD[:1])          # another step, and too few outcomes: nothing pairs up
    assert [said(m) for m in mismatches(PLAN, short)] == ["result answers step 4, the plan is step 3",
                                                          "1 outcomes for 2 plan items"]
    assert list(mismatches(PLAN, result(*GOOD))) == []


def test_decode_item_of_one_token_accepts_nothing():
    place = placements(5, 1, [0, 1])
    plan = ExecutionPlan(0, (PlanItem("a", 5, 1, 0, True, 2, place),))
    validate(plan, ExecutionResult(0, (ItemOutcome("a", 5, 1, 0, place),)))
    with pytest.raises(BoundaryViolation):
        validate(plan, ExecutionResult(0, (ItemOutcome("a", 5, 1, 1, place),)))


def test_build_plan_fields():
    eng = Engine({"engine": {"page_size": 2, "num_pages": 8, "max_step_tokens": 8},
                  "requests": [{"request_id": "x", "prompt_len": 3, "max_new_tokens": 2}]})
    eng.step()
    x = eng.by_id["x"]
    assert x.page_table == [0, 1]
    plan = build_plan(7, [(x, 1, True)], 2)
    assert plan.step == 7
    (item,) = plan.items
    assert item[:6] == ("x", 3, 1, 0, True, 0)
    assert spec_placements(item, 2) == [(3, 1, 1)]


# -- an Engine whose executor tampers with the result -------------------------------------------

WORKLOAD = {
    "engine": {"max_step_tokens": 16, "page_size": 4, "num_pages": 8, "spec_len": 3, "world_size": 2},
    "requests": [{"request_id": "r", "prompt_len": 4, "max_new_tokens": 6, "accept_script": [1]},
                 {"request_id": "s", "prompt_len": 6, "max_new_tokens": 3, "arrival_step": 1}],
}


def snapshot(eng):
    return {
        "requests": [(r.request_id, r.state, r.computed, r.generated, list(r.page_table),
                      r.draft_len, r.num_verdicts, r.finish_reason) for r in eng.requests],
        "owner": list(eng.pool.owner),
        "refs": list(eng.pool.refs),
        "free": eng.pool.free_pages(),
        "slots": eng.pool.slots.snapshot(),
        "cache": [(n.key, n.page) for n in eng.cache.tree_order()],
        "step_id": eng.step_id,
    }


def tamper_accepted(res):
    outs = list(res.outcomes)
    outs[0] = outs[0]._replace(accepted=outs[0].executed_tokens)      # one past drafted
    return res._replace(outcomes=tuple(outs))


def tamper_executed(res):
    outs = list(res.outcomes)
    outs[1] = outs[1]._replace(executed_tokens=outs[1].executed_tokens - 1)
    return res._replace(outcomes=tuple(outs))


def tamper_writes(res):
    outs = list(res.outcomes)
    outs[1] = outs[1]._replace(writes=outs[0].writes)         # r's pages for s
    return res._replace(outcomes=tuple(outs))


def tamper_writes_short(res):
    outs = list(res.outcomes)
    outs[1] = outs[1]._replace(writes=outs[1].writes[:-1])
    return res._replace(outcomes=tuple(outs))


def tamper_drop(res):
    return res._replace(outcomes=res.outcomes[:1])


def tamper_order(res):
    return res._replace(outcomes=res.outcomes[::-1])


def tamper_non_decode_accepted(res):
    outs = list(res.outcomes)
    outs[1] = outs[1]._replace(accepted=1)
    return res._replace(outcomes=tuple(outs))


def tamper_start(res):
    outs = list(res.outcomes)
    outs[0] = outs[0]._replace(start_position=outs[0].start_position + 1)
    return res._replace(outcomes=tuple(outs))


class Tampering:
    """LocalGroup, but the result of one step is altered; records the state at execute time."""

    def __init__(self, workload, at_step, tamper):
        self.inner = LocalGroup(load_workload(workload))
        self.at_step, self.tamper = at_step, tamper
        self.engine = None
        self.before = None

    def execute(self, plan):
        res = self.inner.execute(plan)
        if plan.step != self.at_step:
            return res
        if self.engine is not None:
            self.before = snapshot(self.engine)
        return self.tamper(res)


TAMPERINGS = [tamper_accepted, tamper_executed, tamper_writes, tamper_writes_short, tamper_drop,
              tamper_order, tamper_non_decode_accepted, tamper_start]


@pytest.mark.parametrize("tamper", TAMPERINGS, ids=lambda f: f.__name__)
def test_tampered_result_commits_nothing(tamper):
    ex = Tampering(WORKLOAD, 1, tamper)
    eng = Engine(WORKLOAD, ex)
    ex.engine = eng
    eng.step()
    with pytest.raises(BoundaryViolation) as info:
        eng.step()
    assert info.value.step == 1
    assert info.value.to_json()["error"] == "BoundaryViolation"
    assert ex.before is not None
    # Step 1 was planned (r decodes 4 tokens at 4, s prefills 6): its pages are placed ...
    assert ex.before["requests"][0][2:5] == (4, 1, [0, 1])
    assert ex.before["requests"][1][2:5] == (0, 0, [2, 3])
    # ... and nothing of the result landed.
    assert snapshot(eng) == ex.before


def test_prepare_then_tampered_commit_leaves_the_prepared_state():
    eng = Engine(WORKLOAD)
    eng.step()
    prepared = eng.prepare()
    before = snapshot(eng)
    good = eng.executor.execute(prepared.plan)
    for tamper in TAMPERINGS:
        with pytest.raises(BoundaryViolation):
            eng.commit(prepared, tamper(good))
        assert snapshot(eng) == before
    # The honest result still commits afterwards.
    t = eng.commit(prepared, good)
    assert t.executed == {"r": 4, "s": 6}
    assert (t.drafted, t.accepted, t.rolled_back) == ({"r": 3}, {"r": 1}, {"r": 2})


def test_run_workload_reports_the_violation():
    lines = run_workload(load_workload(WORKLOAD), Tampering(WORKLOAD, 1, tamper_writes))
    assert len(lines) == 2
    assert lines[-1]["error"] == "BoundaryViolation" and lines[-1]["step"] == 1
    assert isinstance(lines[-1]["message"], str) and lines[-1]["message"]


def test_a_result_for_the_wrong_step_is_refused():
    eng = Engine(WORKLOAD)
    prepared = eng.prepare()
    good = eng.executor.execute(prepared.plan)
    with pytest.raises(BoundaryViolation):
        eng.commit(prepared, good._replace(step=5))
