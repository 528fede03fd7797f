"""The columnar PLAN and RESULT (protocol 3 and 4), without processes.

1. Any valid plan or result round-trips, to the same value and the same bytes (hypothesis),
   prior_drafts (the seventh column) included.
2. An honest rank's RESULT, built from the plan's bytes and its verdict column, is the very
   bytes of the RESULT of the outcomes built item by item; read back against the plan it
   answers, it decodes to the same outcomes as without the plan, and so does any lie. With
   items planned ahead (overlap), the RESULT the rank builds from the columns it placed
   (`place_columns`, `encode_result_columns`) is the very bytes of the general path's.
3. The rank's columnar execution (`accepted`, `place_columns`, `apply_columns`) is `verdicts`
   and `apply`, on every step of the golden workloads at full and at overlap, shard for shard.
4. The worker's hot path (`Worker.answer`) sends what the general path sends and leaves the
   same shard, at full and at overlap; a page id past the shard fails before anything is
   sent or written.
5. Hostile columns: every cut, every int32 of a valid body set to a hostile value, is a
   `WireError` or a well-formed plan; the errors say what is wrong.
"""
from __future__ import annotations

import struct

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferris_dist.engine import Engine, EngineError, LocalGroup, accept_scripts, load_workload
from inferris_dist.engine.messages import ExecutionPlan, ItemOutcome, PlanItem
from inferris_dist.engine.rank import RankExecutor, verdict
from inferris_dist.protocol import wire
from inferris_dist.protocol.faults import FaultPlan, parse_fault
from inferris_dist.protocol.wire import MsgType, WireError
from inferris_dist.rank.worker import Worker

from tests.helpers.external import GOLDEN, golden_workload

pytestmark = pytest.mark.timeout(60)

FUZZ = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
INT32 = 2**31 - 1
IDS = st.text(max_size=8)
PAGE = st.integers(0, INT32)
PLAN_ITEMS = st.builds(PlanItem, IDS, st.integers(0, INT32), st.integers(1, INT32), st.integers(0, INT32),
                       st.booleans(), st.integers(0, INT32), st.lists(PAGE, max_size=6).map(tuple),
                       st.one_of(st.just(0), st.integers(0, INT32)))
# An item planned ahead (prior_drafts > 0) is a decode with a verdict before it, and its start
# leaves room for its prior drafts: the decoder refuses any other (see test_an_item_ahead_...).
PLAN_ITEMS = PLAN_ITEMS.map(lambda i: i if not i.prior_drafts else i._replace(
    decode=True, verdict_index=max(i.verdict_index, 1), start_position=max(i.start_position, i.prior_drafts)))
PLANS = st.builds(ExecutionPlan, st.integers(-(2**63), 2**64 - 1),
                  st.lists(PLAN_ITEMS, max_size=12).map(tuple))
OUTCOMES = st.lists(st.builds(ItemOutcome, IDS, st.integers(0, INT32), st.integers(0, INT32),
                              st.integers(0, INT32), st.lists(PAGE, max_size=6).map(tuple)),
                    max_size=12).map(tuple)


def i32(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}i", *values)


# -- 1. round trips --------------------------------------------------------------------------

@settings(max_examples=150, **FUZZ)
@given(PLANS)
def test_any_valid_plan_roundtrips(plan):
    frame = wire.encode_body(MsgType.PLAN, plan)
    got = wire.decode_body(MsgType.PLAN, frame)
    assert got == plan
    assert all(type(i.decode) is bool and type(i.placements) is tuple for i in got.items)
    assert wire.encode_body(MsgType.PLAN, got) == frame
    columns = wire.decode_plan_columns(frame)
    assert wire.plan_of(columns) == plan and columns.step == plan.step
    n = len(plan.items)
    assert len(columns.cols) == 7 * n and len(columns.raw_cols) == 28 * n
    assert columns.column("decode").tolist() == [int(i.decode) for i in plan.items]
    assert columns.column("prior_drafts").tolist() == [i.prior_drafts for i in plan.items]


@pytest.mark.parametrize("item", [PlanItem("a", 9, 3, 2, False, 4, (1, 2), 3),     # no decode
                                  PlanItem("a", 9, 3, 2, True, 0, (1, 2), 3),      # no verdict before
                                  PlanItem("a", 2, 1, 0, True, 1, (0, 1), 3)])     # starts before 0
def test_an_item_ahead_that_cannot_be_is_refused(item):
    frame = wire.encode_body(MsgType.PLAN, ExecutionPlan(4, (PlanItem("b", 0, 2, 0, False, 0, (7,)), item)))
    with pytest.raises(WireError, match="item 1 follows 3 drafts"):
        wire.decode_plan_columns(frame)


def test_a_plan_with_prior_drafts_roundtrips():
    plan = ExecutionPlan(4, (PlanItem("a", 9, 3, 2, True, 4, (1, 2), 3),
                             PlanItem("b", 0, 2, 0, False, 0, (7,)),
                             PlanItem("c", 5, 1, 0, True, 1, (3, 4), 1)))
    frame = wire.encode_body(MsgType.PLAN, plan)
    got = wire.decode_body(MsgType.PLAN, frame)
    assert got == plan and [i.prior_drafts for i in got.items] == [3, 0, 1]
    assert all(type(i.prior_drafts) is int for i in got.items)
    assert wire.encode_body(MsgType.PLAN, got) == frame
    columns = wire.decode_plan_columns(frame)
    assert columns.column("prior_drafts").tolist() == [3, 0, 1] and wire.plan_of(columns) == plan


@settings(max_examples=150, **FUZZ)
@given(OUTCOMES)
def test_any_valid_result_roundtrips(outcomes):
    frame = wire.encode_body(MsgType.RESULT, outcomes)
    got = wire.decode_body(MsgType.RESULT, frame)
    assert got == outcomes and type(got) is tuple
    assert wire.encode_body(MsgType.RESULT, got) == frame


def test_values_past_int32_are_refused_when_encoding():
    for bad in (2**31, -(2**31) - 1):
        with pytest.raises(WireError, match="int32"):
            wire.encode_body(MsgType.PLAN, ExecutionPlan(0, (PlanItem("a", bad, 1, 0, False, 0, (0,)),)))
        with pytest.raises(WireError, match="int32"):
            wire.encode_body(MsgType.PLAN, ExecutionPlan(0, (PlanItem("a", 0, 1, 0, False, 0, (0,), bad),)))
        with pytest.raises(WireError, match="int32"):
            wire.encode_body(MsgType.RESULT, (ItemOutcome("a", 0, 1, 0, (bad,)),))


# -- 2. the honest rank's RESULT, and reading it back against the plan -------------------------

SCRIPTS = st.dictionaries(st.sampled_from(["a", "b", "c", ""]), st.lists(st.integers(-3, 9), max_size=4)
                          .map(tuple), max_size=3)
# None planned ahead (prior_drafts 0: `encode_result_of`'s plans); those are AHEAD_PLANS below.
SMALL_ITEMS = st.builds(PlanItem, st.sampled_from(["a", "b", "c", "", "ü"]), st.integers(0, 300),
                        st.integers(1, 9), st.integers(0, 8), st.booleans(), st.integers(0, 5),
                        st.lists(st.integers(0, 15), max_size=4).map(tuple), st.just(0))
SMALL_PLANS = st.builds(ExecutionPlan, st.integers(0, 99), st.lists(SMALL_ITEMS, max_size=8).map(tuple))


@settings(max_examples=150, **FUZZ)
@given(SMALL_PLANS, SCRIPTS, st.data())
def test_the_rank_result_from_columns_is_the_result_of_the_outcomes(plan, scripts, data):
    rank = RankExecutor(0, 1, 16, 4, scripts)
    outcomes = rank.verdicts(plan).outcomes
    frame, sent = wire.encode_plan(plan)
    columns = wire.decode_plan_columns(frame)
    n = len(plan.items)
    accepted = rank.accepted(columns.request_ids, columns.column("num_tokens"), columns.column("decode"),
                             columns.column("verdict_index"))
    assert accepted == [o.accepted for o in outcomes]
    reply = wire.encode_result_of(columns, accepted)
    assert reply == wire.encode_body(MsgType.RESULT, outcomes)
    assert wire.decode_result(reply, sent) == outcomes == wire.decode_result(reply)
    if n:                                     # a lie in any field: the same outcomes either way
        i = data.draw(st.integers(0, n - 1))
        field = data.draw(st.sampled_from(ItemOutcome._fields))
        value = {"request_id": "zz", "writes": outcomes[i].writes + (3,)}.get(field, 77)
        lie = outcomes[:i] + (outcomes[i]._replace(**{field: value}),) + outcomes[i + 1:]
        lied = wire.encode_body(MsgType.RESULT, lie)
        assert wire.decode_result(lied, sent) == lie == wire.decode_result(lied)
    with pytest.raises(WireError):            # the checks hold on the way that reads the plan back
        wire.decode_result(msgpack.packb(((), b"", i32(-1))), sent)


@settings(max_examples=250, **FUZZ)
@given(st.lists(st.tuples(st.one_of(st.none(), st.lists(st.integers(-4, 12), max_size=4).map(tuple)),
                          st.integers(0, 6), st.integers(0, 10), st.booleans()), max_size=8))
def test_the_inlined_verdicts_are_verdict(rows):
    """`accepted` inlines `verdict` (the rank's hot path): the same answer for any script,
    index, token count (even 0, which no plan has) and decode flag."""
    scripts = {f"r{i}": script for i, (script, _, _, _) in enumerate(rows) if script is not None}
    rank = RankExecutor(0, 1, 4, 4, scripts)
    got = rank.accepted([f"r{i}" for i in range(len(rows))], [c for _, _, c, _ in rows],
                        [d for *_, d in rows], [i for _, i, _, _ in rows])
    assert got == [verdict(script, index, count - 1) if decode else 0
                   for script, index, count, decode in rows]


def test_an_honest_result_shares_the_plans_values():
    plan = ExecutionPlan(1, (PlanItem("a", 4, 2, 1, True, 0, (1, 2)), PlanItem("b", 0, 3, 0, False, 0, (5,))))
    frame, sent = wire.encode_plan(plan)
    reply = wire.encode_result_of(wire.decode_plan_columns(frame), [1, 0])
    outcomes = wire.decode_result(reply, sent)
    assert all(o.writes is i.placements for o, i in zip(outcomes, plan.items))
    assert outcomes == (ItemOutcome("a", 4, 2, 1, (1, 2)), ItemOutcome("b", 0, 3, 0, (5,)))


def columnar_answer(rank: RankExecutor, c: wire.PlanColumns) -> bytes:
    """What `Worker.answer` does with a plan's columns: its RESULT body, its shard written after."""
    ids, counts, n = c.request_ids, c.column("num_tokens"), len(c.request_ids)
    indexes, priors = c.column("verdict_index"), c.column("prior_drafts")
    accepted = rank.accepted(ids, counts, c.column("decode"), indexes)
    starts, num_pages, pages = c.column("start_position"), c.column("num_pages"), c.pages
    if n and max(priors):
        starts, num_pages, pages = rank.place_columns(ids, starts, counts, indexes, num_pages, priors, pages)
        body = wire.encode_result_columns(ids, starts, counts, accepted, num_pages, pages)
    else:
        body = wire.encode_result_of(c, accepted)
    rank.apply_columns(ids, starts, counts, num_pages, pages)
    return body


@st.composite
def ahead_plans(draw):
    """(page size, plan) with items planned ahead as the engine plans them: an item after
    `prior_drafts` assumed drafts has a verdict before it (verdict_index >= 1), starts at least
    that far in, and its placements hold [start - prior_drafts, start + num_tokens)."""
    page_size = draw(st.integers(1, 5))
    items = []
    for _ in range(draw(st.integers(0, 8))):
        prior = draw(st.sampled_from([0, 1, 2, 3, 4, 8]))
        start, n = draw(st.integers(prior, 300)), draw(st.integers(1, 9))
        k = (start + n - 1) // page_size - (start - prior) // page_size + 1
        rid = draw(st.sampled_from(["a", "b", "c", "", "ü"]))
        items.append(PlanItem(rid, start, n, draw(st.integers(0, 8)), draw(st.booleans()) or prior > 0,
                              draw(st.integers(1 if prior else 0, 5)),
                              tuple(draw(st.lists(st.integers(0, 15), min_size=k, max_size=k))), prior))
    return page_size, ExecutionPlan(draw(st.integers(0, 99)), tuple(items))


@settings(max_examples=200, **FUZZ)
@given(ahead_plans(), SCRIPTS)
def test_the_rank_result_of_a_plan_ahead_from_columns_is_the_result_of_the_outcomes(sized, scripts):
    """Items planned ahead are placed by the rank's own verdicts: the columns it places give
    the very bytes of the general path's RESULT, and the same shard."""
    page_size, plan = sized
    general, columnar = (RankExecutor(0, 1, 16, page_size, scripts) for _ in range(2))
    outcomes = general.verdicts(plan).outcomes
    general.apply(plan)
    frame, sent = wire.encode_plan(plan)
    reply = columnar_answer(columnar, wire.decode_plan_columns(frame))
    assert reply == wire.encode_body(MsgType.RESULT, outcomes)
    assert wire.decode_result(reply, sent) == outcomes == wire.decode_result(reply)
    assert columnar.shard.snapshot() == general.shard.snapshot()
    for item, outcome in zip(plan.items, outcomes):        # each item ran where its verdict says
        prior = item.prior_drafts
        rejected = prior and prior - verdict(scripts.get(item.request_id), item.verdict_index - 1, prior)
        start = outcome.start_position
        assert start == item.start_position - rejected
        first = (item.start_position - prior) // page_size
        assert outcome.writes == item.placements[start // page_size - first:
                                                 (start + item.num_tokens - 1) // page_size - first + 1]


# -- 3. columnar execution is execution --------------------------------------------------------

SPECS = ["demo", "speculative", "preemption", "prefix_reuse", "cache_eviction", "chunked_prefill",
         "world_size_8", "random_017", "irreducible"]


# Golden workloads whose overlap run plans items ahead (prior_drafts > 0), some after drafts
# the ranks reject, some after drafts they accept whole; demo plans none ahead.
OVERLAP_SPECS = ["speculative", "random_008", "random_011", "random_028", "random_030", "spec_budget_cut",
                 "demo"]


def engine_plans(name: str, rung: str = "full") -> tuple[list[ExecutionPlan], object]:
    """The plans of a golden workload's run at `rung`, in the order the ranks execute them
    (at overlap, `collect` executes each plan sent ahead in turn)."""
    workload = golden_workload(name)
    plans = []

    class Recording(LocalGroup):
        def execute(self, plan):
            plans.append(plan)
            return super().execute(plan)

    try:
        for _ in Engine(workload, Recording(workload), rung=rung).run():
            pass
    except EngineError:
        pass
    return plans, workload


def ahead_items(plans, workload) -> tuple[int, int]:
    """(items planned ahead after drafts some of which the ranks reject, those after drafts all accepted)."""
    scripts = accept_scripts(workload)
    drafted = [(i.prior_drafts, verdict(scripts.get(i.request_id), i.verdict_index - 1, i.prior_drafts))
               for p in plans for i in p.items if i.prior_drafts]
    return sum(a < d for d, a in drafted), sum(a == d for d, a in drafted)


def test_the_overlap_goldens_plan_ahead_after_rejected_and_after_accepted_drafts():
    """The overlap tests below are not vacuous: their plans have both kinds of items ahead."""
    counts = {name: ahead_items(*engine_plans(name, "overlap")) for name in OVERLAP_SPECS}
    assert counts["speculative"][0] and counts["speculative"][1] and counts["demo"] == (0, 0)
    assert all(rejected for name, (rejected, _) in counts.items() if name != "demo")
    assert sum(accepted for _, accepted in counts.values()) >= 10


@pytest.mark.parametrize("name,rung", [(n, "full") for n in SPECS] + [(n, "overlap") for n in OVERLAP_SPECS])
def test_columnar_execution_is_execution_on_the_goldens(name, rung):
    """What `Worker.answer` does with a plan's columns (`accepted`; `encode_result_of`, or for
    items planned ahead `place_columns` + `encode_result_columns`) is the very bytes of
    `verdicts` -> `encode_body(RESULT)`, and `apply_columns` leaves the shard `apply` leaves,
    at every step, at `full` and at `overlap`."""
    plans, workload = engine_plans(name, rung)
    assert plans
    cfg = workload.config
    scripts = accept_scripts(workload)
    items, columnar = (RankExecutor(0, 1, cfg.num_pages, cfg.page_size, scripts) for _ in range(2))
    for plan in plans:
        outcomes = items.verdicts(plan).outcomes
        frame, sent = wire.encode_plan(plan)
        reply = columnar_answer(columnar, wire.decode_plan_columns(frame))
        assert reply == wire.encode_body(MsgType.RESULT, outcomes), f"step {plan.step}"
        assert wire.decode_result(reply, sent) == outcomes
        items.apply(plan)
        assert columnar.shard.snapshot() == items.shard.snapshot(), f"step {plan.step}"


# -- 4. the worker's hot path ------------------------------------------------------------------

class Socket:
    """Keeps each message sent, frame by frame as ZeroMQ takes them (SNDMORE until the last)."""

    def __init__(self):
        self.sent: list[list[bytes]] = []
        self.partial: list[bytes] = []

    def send(self, frame, flags=0):
        self.partial.append(frame)
        if not flags & zmq.SNDMORE:
            self.sent.append(self.partial)
            self.partial = []


def worker(workload, faults=()) -> Worker:
    """A Worker's answering half, on a socket that keeps what is sent (no connection)."""
    cfg = workload.config
    w = Worker.__new__(Worker)
    w.rank, w.world_size, w.epoch, w.timing, w.times = 1, 2, 0, False, (0.0, 0.0)
    w.num_pages = cfg.num_pages
    w.executor = RankExecutor(1, 2, cfg.num_pages, cfg.page_size, accept_scripts(workload))
    w.faults = FaultPlan([parse_fault(f) for f in faults])
    w.sock = Socket()
    return w


@pytest.mark.parametrize("name,rung", [(name, "full") for name in ("speculative", "preemption", "random_017")]
                         + [(name, "overlap") for name in OVERLAP_SPECS])
def test_the_hot_path_sends_what_the_general_path_sends(name, rung):
    plans, workload = engine_plans(name, rung)
    fast, general = worker(workload), worker(workload)
    for plan in plans:
        frame = wire.encode_body(MsgType.PLAN, plan)
        fast.answer(wire.decode_plan_columns(frame))
        general.answer_with_faults({}, wire.decode_body(MsgType.PLAN, frame))
        assert fast.sock.sent[-1] == general.sock.sent[-1]
        header = wire.decode_header(fast.sock.sent[-1][0])
        assert (header.type, header.step, header.rank) == (MsgType.RESULT, plan.step, 1)
        assert fast.executor.shard.snapshot() == general.executor.shard.snapshot()
    assert fast.faults.previous == fast.sock.sent[-1]


def test_a_fault_on_the_step_takes_the_general_path():
    plans, workload = engine_plans("demo")
    plan = next(p for p in plans if p.items)
    w = worker(workload, [f"1:disagree@{plan.step}"])
    w.answer(wire.decode_plan_columns(wire.encode_body(MsgType.PLAN, plan)))
    honest = RankExecutor(0, 1, workload.config.num_pages, workload.config.page_size,
                          accept_scripts(workload)).verdicts(plan).outcomes
    got = wire.decode_body(MsgType.RESULT, w.sock.sent[-1][1])
    assert got[0].accepted == honest[0].accepted + 1 and got[1:] == honest[1:]


def test_a_page_past_the_shard_fails_before_anything_is_sent_or_written():
    workload = load_workload(GOLDEN / "demo.spec.json")
    w = worker(workload)
    past = workload.config.num_pages
    plan = ExecutionPlan(0, (PlanItem("r0", 0, 2, 0, False, 0, (0,)),
                             PlanItem("r1", 0, 2, 0, False, 0, (past,))))
    with pytest.raises(ValueError, match=f"page {past} is outside the shard's {past} pages"):
        w.answer(wire.decode_plan_columns(wire.encode_body(MsgType.PLAN, plan)))
    assert w.sock.sent == [] and w.executor.shard.snapshot() == []


# -- 5. hostile columns ------------------------------------------------------------------------

# r0 planned ahead after 2 drafts: its placements hold [4, 9) (page size 4).
VALID = ExecutionPlan(7, (PlanItem("r0", 6, 3, 2, True, 1, (4, 5), 2),
                          PlanItem("r1", 0, 4, 0, False, 0, (6,))))


def refused_or_well_formed(kind: MsgType, frame: bytes):
    try:
        value = wire.decode_body(kind, frame)
    except WireError:
        return None
    if kind is MsgType.PLAN:
        for item in value.items:
            assert type(item.decode) is bool and min(item[1:4]) >= 0 and item.num_tokens >= 1
            assert item.verdict_index >= 0 and all(type(p) is int and p >= 0 for p in item.placements)
            assert type(item.prior_drafts) is int and item.prior_drafts >= 0
    else:
        for o in value:
            assert min(o[1:4]) >= 0 and all(type(p) is int and p >= 0 for p in o.writes)
    return value


def test_every_int32_of_a_plan_and_a_result_set_hostile():
    outcomes = RankExecutor(0, 1, 8, 4, {}).verdicts(VALID).outcomes
    frames = {MsgType.PLAN: wire.encode_body(MsgType.PLAN, VALID),
              MsgType.RESULT: wire.encode_body(MsgType.RESULT, outcomes)}
    for kind, frame in frames.items():
        body = msgpack.unpackb(frame, use_list=False)
        cols_at = 2 if kind is MsgType.PLAN else 1
        for where in (cols_at, cols_at + 1):
            column = body[where]
            for k in range(len(column) // 4):
                for value in (-1, -(2**31), 2, INT32, 0):
                    bad = column[:4 * k] + i32(value) + column[4 * k + 4:]
                    refused_or_well_formed(kind, msgpack.packb(body[:where] + (bad,) + body[where + 1:]))
        for n in range(len(frame)):
            with pytest.raises(WireError):
                wire.decode_body(kind, frame[:n])


@pytest.mark.parametrize("body,why", [
    ((3, ("a",), i32(-1, 4, 0, 0, 0, 1, 0), i32(0)), "negative start_position"),
    ((3, ("a",), i32(0, 0, 0, 0, 0, 1, 0), i32(0)), "no tokens"),
    ((3, ("a",), i32(0, 4, -2, 0, 0, 1, 0), i32(0)), "negative draft_len"),
    ((3, ("a",), i32(0, 4, 0, 2, 0, 1, 0), i32(0)), "neither 0 nor 1"),
    ((3, ("a",), i32(0, 4, 0, 0, -1, 1, 0), i32(0)), "negative verdict_index"),
    ((3, ("a",), i32(0, 4, 0, 0, 0, 1, -1), i32(0)), "negative prior_drafts"),
    ((3, ("a",), i32(0, 4, 0, 1, 1, 1, -(2**31)), i32(0)), "negative prior_drafts"),
    ((3, ("a",), i32(0, 4, 0, 0, 0, 2, 0), i32(0)), "claim 2 pages, the placements hold 1"),
    ((3, ("a",), i32(0, 4, 0, 0, 0, 1, 2), i32(0, 1)), "claim 1 pages, the placements hold 2"),
    ((3, ("a",), i32(0, 4, 0, 0, 0, 1, 0), i32(-3)), "negative page id"),
    ((3, ("a",), i32(0, 4, 0, 0, 0, 1, 0), b"\x00\x00"), "2 bytes are no whole int32s"),
    ((3, ("a",), i32(0, 4, 0, 0, 0, 1), i32(0)), "24 bytes of columns for 1 items, want 28"),
    ((3, ("a", "b"), i32(0, 4, 0, 0, 0, 1, 0), i32(0)), "28 bytes of columns for 2 items, want 56"),
    ((3, ("a", 5), i32(0, 4, 0, 0, 0, 1, 0) * 2, i32(0, 0)), "request id that is no string"),
])
def test_a_malformed_plan_says_what_is_wrong(body, why):
    with pytest.raises(WireError, match=why):
        wire.decode_body(MsgType.PLAN, msgpack.packb(body))
    with pytest.raises(WireError, match=why):
        wire.decode_plan_columns(msgpack.packb(body))


@pytest.mark.parametrize("body,why", [
    ((("a",), i32(0, 4, -1, 1), i32(0)), "negative accepted"),
    ((("a",), i32(0, 4, 0, 3), i32(0)), "claim 3 writes, the writes hold 1"),
    ((("a",), i32(0, 4, 0, 1), i32(-1)), "negative page id"),
    ((("a",), i32(0, 4, 0), i32(0)), "12 bytes of columns for 1 outcomes, want 16"),
    (((b"a",), i32(0, 4, 0, 1), i32(0)), "request id that is no string"),
])
def test_a_malformed_result_says_what_is_wrong(body, why):
    with pytest.raises(WireError, match=why):
        wire.decode_body(MsgType.RESULT, msgpack.packb(body))


def test_columns_longer_than_a_string_cross_whole():
    """A column is one bin: a plan of 20 000 items (560 kB of columns) crosses whole."""
    plan = ExecutionPlan(1, tuple(PlanItem(f"r{i}", i, 1, 0, True, 0, (i % 50,)) for i in range(20_000)))
    frame = wire.encode_body(MsgType.PLAN, plan)
    assert len(frame) > wire.MAX_STR_LEN and wire.decode_body(MsgType.PLAN, frame) == plan
