"""The harness of the invariant tests: the state check every committed step must pass, and the
helpers the tests of the mechanism notes (tests/test_note_NN_*.py) share.

`check_invariants(eng)` asserts the bookkeeping invariants of the engine (SPEC §2, §3) from
the outside, after a committed step:

    from tests.helpers.invariants import check_invariants
    eng = Engine(workload)
    for trace in eng.run():
        check_invariants(eng)

It reads only the engine's public-ish state: `engine.requests`, `engine.pool`
(`owner`, `refs`, `free_pages()`, `num_pages`, `page_size`, `slots`),
`engine.cache` (`node_of_page`, `tree_order()`) and `engine.CACHE` /
`engine.pool.CACHE` (the cache-owner sentinel, taken from the `engine`
package if the instance does not carry it).

The rest drives real engines, nothing mocked: `drive(eng)` steps one exactly as `Engine.run`
does and yields a `Step` after each step (the control plane before it, when its plan went
out, once committed); `plan_steps(workload, rung)` yields the steps that sent a plan, each
checked with `check_invariants`; `bounded` fails a run past MAX_STEPS (a run's SPEC §4 lines
are the engine's own `trace_dicts` / `trace_objects` / `trace_json_lines`). Workloads are
the golden ones or drawn by the strategies here (derandomized with `PROPERTY`: every run
checks the same examples). The `replay_*` helpers compute phase 4
from outside, on the state before a step.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from inferris_dist import engine as engine_pkg
from inferris_dist.engine import Engine, EngineError, State, Workload, load_workload, pages_needed

from tests.helpers.external import GOLDEN, LADDER


def _cache_sentinel(eng):
    for holder in (eng, eng.pool):
        sentinel = getattr(holder, "CACHE", None)
        if sentinel is not None:
            return sentinel
    return engine_pkg.CACHE


def _pages_needed(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def check_invariants(eng) -> None:
    """Assert every bookkeeping invariant of a committed step; the message says which broke."""
    pool, cache = eng.pool, eng.cache
    CACHE = _cache_sentinel(eng)
    num_pages, page_size = pool.num_pages, pool.page_size
    owner, refs = pool.owner, pool.refs
    requests = eng.requests
    by_id = {r.request_id: r for r in requests}
    assert len(by_id) == len(requests), "duplicate request ids in engine.requests"
    assert len(owner) == num_pages and len(refs) == num_pages

    # -- the free list: no duplicates, exactly the unowned pages ---------------------------
    free = pool.free_pages()
    assert len(free) == len(set(free)), f"free list has duplicates: {free}"
    assert all(0 <= p < num_pages for p in free), f"free list has a bad page id: {free}"
    free_set = set(free)
    unowned = {p for p in range(num_pages) if owner[p] is None}
    assert free_set == unowned, (f"free list {sorted(free_set)} != pages with no owner "
                                 f"{sorted(unowned)}")
    owned = [p for p in range(num_pages) if owner[p] is not None]
    assert len(free) + len(owned) == num_pages, "free + owned != num_pages"
    for p in free:
        assert all(s is None for s in pool.slots.slots(p)), f"free page {p} has non-empty slots"

    # -- every owner is the cache or an unfinished request --------------------------------
    for p in owned:
        o = owner[p]
        if o is CACHE:
            continue
        assert isinstance(o, str) and o in by_id, f"page {p} owned by unknown {o!r}"
        assert by_id[o].state is not State.FINISHED, f"page {p} owned by finished request {o}"

    # -- page tables --------------------------------------------------------------------
    mapped_by: dict[int, list[str]] = {}
    for r in requests:
        table = r.page_table
        rid = r.request_id
        assert len(table) == len(set(table)), f"{rid}: page table maps a page twice: {table}"
        if r.state is State.FINISHED:
            assert table == [], f"finished {rid} still holds pages {table}"
            assert r.finish_reason is not None, f"finished {rid} has no finish_reason"
            continue
        assert r.finish_reason is None, f"unfinished {rid} has finish_reason {r.finish_reason}"
        if r.state is State.WAITING:
            assert table == [] and r.computed == 0 and r.generated == 0, f"waiting {rid} has state"
            continue
        assert r.state is State.RUNNING, f"{rid}: unknown state {r.state!r}"
        assert 0 <= r.computed <= r.prompt + r.generated, (
            f"{rid}: computed {r.computed} outside [0, target {r.prompt + r.generated}]")
        assert 0 <= r.generated < r.max_new_tokens, (
            f"running {rid}: generated {r.generated}, max_new_tokens {r.max_new_tokens}")
        assert len(table) == _pages_needed(r.computed, page_size), (
            f"{rid}: page table {table} for computed {r.computed} "
            f"(want {_pages_needed(r.computed, page_size)} pages)")
        for logical, p in enumerate(table):
            assert 0 <= p < num_pages, f"{rid}: bad page id {p}"
            assert p not in free_set, f"{rid}: page table maps free page {p}"
            o = owner[p]
            assert o is CACHE or o == rid, f"{rid}: maps page {p} owned by {o!r}"
            mapped_by.setdefault(p, []).append(rid)
            if o == rid:
                # the request's own page holds exactly its own positions below the frontier
                for off in range(page_size):
                    pos = logical * page_size + off
                    if pos < r.computed:
                        got = pool.slots.slot(p, off)
                        assert got == (rid, pos), (f"{rid}: page {p} slot {off} holds {got}, "
                                                   f"want {(rid, pos)}")

    # -- a request-owned page lives in its owner's page table and nowhere else ----------
    for p in owned:
        o = owner[p]
        if o is CACHE:
            continue
        assert mapped_by.get(p) == [o], (f"page {p} owned by {o} is mapped by "
                                         f"{mapped_by.get(p, [])}")

    # -- cache pages: refs count the page tables mapping them --------------------------
    cache_pages = {p for p in owned if owner[p] is CACHE}
    for p in cache_pages:
        n = len(mapped_by.get(p, []))
        assert refs[p] == n, f"cache page {p}: refs {refs[p]}, mapped by {mapped_by.get(p, [])}"

    # -- cache nodes hold exactly the cache-owned pages ----------------------------------
    node_of_page = cache.node_of_page
    assert set(node_of_page) == cache_pages, (
        f"cache nodes hold pages {sorted(node_of_page)}, cache-owned pages are "
        f"{sorted(cache_pages)}")
    nodes = list(cache.tree_order())
    tree_pages = [n.page for n in nodes]
    assert len(tree_pages) == len(set(tree_pages)), f"two cache nodes share a page: {tree_pages}"
    assert set(tree_pages) == cache_pages, (
        f"tree order visits pages {tree_pages}, cache-owned pages are {sorted(cache_pages)}")
    for n in nodes:
        assert node_of_page[n.page] is n, f"node_of_page[{n.page}] is not the tree's node"
        parent = getattr(n, "parent", None)
        children = getattr(parent, "children", None)
        if children is not None:
            assert children.get(n.key) is n, f"node of page {n.page} not under its parent"

    # -- counters the engine keeps for itself ------------------------------------------
    num_unfinished = getattr(eng, "num_unfinished", None)
    if num_unfinished is not None:
        real = sum(1 for r in requests if r.state is not State.FINISHED)
        assert num_unfinished == real, f"num_unfinished {num_unfinished}, really {real}"


# =============================================================================================
# The harness of the mechanism-note tests
# =============================================================================================

# No workload here needs more than a few hundred steps (the longest golden: 530; a drawn one,
# a few dozen): a run past this has stopped ending.
MAX_STEPS = 2000

# Deterministic: the same examples every run, and nothing written to a database.
PROPERTY = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

CASES = sorted(p.name.split(".")[0] for p in LADDER.glob("*.00.trace.jsonl"))    # the ladder's
GOLDEN_NAMES = sorted(p.name.removesuffix(".spec.json") for p in GOLDEN.glob("*.spec.json"))
CACHE_RUNGS = ("08a", "08b", "08c", "full")


def as_workload(workload) -> Workload:
    return workload if isinstance(workload, Workload) else load_workload(workload)


# -- drawn workloads ------------------------------------------------------------------------

@st.composite
def workloads(draw, max_requests: int = 5) -> dict:
    """A small workload with staggered arrivals, EOS now and then, any budget and pool."""
    requests = []
    for i in range(draw(st.integers(1, max_requests))):
        req = {"request_id": f"r{i}", "prompt_len": draw(st.integers(1, 10)),
               "max_new_tokens": draw(st.integers(1, 4))}
        if draw(st.booleans()):
            req["arrival_step"] = draw(st.integers(0, 4))
        if draw(st.integers(0, 3)) == 0:
            req["eos_after"] = draw(st.integers(0, 4))
        requests.append(req)
    knobs = {"max_step_tokens": draw(st.integers(1, 12)), "page_size": draw(st.integers(1, 4)),
             "num_pages": draw(st.integers(1, 12))}
    return {"engine": knobs, "requests": requests}


@st.composite
def prefix_workloads(draw) -> dict:
    """Prompts (explicit tokens) that share prefixes, small pools, drafts and verdict scripts."""
    ps = draw(st.integers(1, 4))
    bases = draw(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=12), min_size=1, max_size=3))
    requests = []
    for i in range(draw(st.integers(1, 5))):
        base = draw(st.sampled_from(bases))
        tokens = base[:draw(st.integers(1, len(base)))] + draw(st.lists(st.integers(0, 2), max_size=5))
        requests.append({
            "request_id": f"r{i}", "tokens": tokens, "max_new_tokens": draw(st.integers(1, 6)),
            "arrival_step": draw(st.integers(0, 5)),
            "eos_after": draw(st.none() | st.integers(0, 6)),
            "accept_script": draw(st.none() | st.lists(st.integers(-1, 4), max_size=4)),
        })
    return {"engine": {"page_size": ps, "num_pages": draw(st.integers(3, 12)),
                       "max_step_tokens": draw(st.integers(1, 12)),
                       "spec_len": draw(st.integers(0, 3))},
            "requests": requests}


def roomy(w: dict) -> dict:
    """The same workload with a pool no step can run short of (every request's whole life at once)."""
    w = copy.deepcopy(w)
    ps = w["engine"].get("page_size", 4)
    w["engine"]["num_pages"] = sum(pages_needed(r["prompt_len"] + r["max_new_tokens"], ps)
                                   for r in w["requests"]) + 1
    return w


# -- the control plane at one moment, copied -----------------------------------------------

class Snap(NamedTuple):
    """One request."""
    index: int
    state: State
    prompt: int
    generated: int
    computed: int
    table: tuple
    draft_len: int
    num_verdicts: int

    @property
    def owed(self) -> int:
        return self.prompt + self.generated - self.computed


def snap(eng) -> dict[str, Snap]:
    """Every request, by id."""
    return {r.request_id: Snap(r.index, r.state, r.prompt, r.generated, r.computed,
                               tuple(r.page_table), r.draft_len, r.num_verdicts)
            for r in eng.requests}


@dataclass
class View:
    """The requests (`view[rid]` is one), the pool and the cache, copied."""
    requests: dict[str, Snap]
    owner: list
    refs: list[int]
    free: list[int]
    paths: list[tuple[tuple[int, ...], int]]      # cache nodes in tree order: (keys from ROOT, page)

    def __getitem__(self, rid: str) -> Snap:
        return self.requests[rid]

    @cached_property
    def tables(self) -> dict[str, list[int]]:
        return {rid: list(x.table) for rid, x in self.requests.items()}

    @cached_property
    def computed(self) -> dict[str, int]:
        return {rid: x.computed for rid, x in self.requests.items()}

    @cached_property
    def generated(self) -> dict[str, int]:
        return {rid: x.generated for rid, x in self.requests.items()}

    @cached_property
    def state(self) -> dict[str, State]:
        return {rid: x.state for rid, x in self.requests.items()}

    @cached_property
    def drafts(self) -> dict[str, int]:
        return {rid: x.draft_len for rid, x in self.requests.items()}

    @cached_property
    def verdicts(self) -> dict[str, int]:
        return {rid: x.num_verdicts for rid, x in self.requests.items()}

    @property
    def path_set(self) -> set[tuple[int, ...]]:
        return {p for p, _ in self.paths}

    @property
    def page_of(self) -> dict[tuple[int, ...], int]:
        return dict(self.paths)


def cache_paths(cache) -> list[tuple[tuple[int, ...], int]]:
    """Every node of a RadixCache as (its keys from ROOT, its page), in tree order."""
    path_of = {id(cache.root): ()}
    out = []
    for node in cache.tree_order():
        path = path_of[id(node.parent)] + (node.key,)
        path_of[id(node)] = path
        out.append((path, node.page))
    return out


def view(eng) -> View:
    return View(snap(eng), list(eng.pool.owner), list(eng.pool.refs), eng.pool.free_pages(),
                cache_paths(eng.cache))


# -- stepping an engine through its own phases -------------------------------------------

@dataclass
class Step:
    """One step of a run, with the control plane around it."""
    eng: Engine
    trace: object                 # the StepTrace
    before: View                  # after the previous commit
    after: View                   # once this step is committed
    mid: View | None = None       # once phases 1-6 are done, when the plan goes out (None: idle step)
    prepared: object = None       # the PreparedStep, phases 1-6 (None: idle step)
    reuse: dict = field(default_factory=dict)     # SPEC phase 2 from `before` (see spec_reuse)

    @property
    def step(self) -> int:
        return self.trace.step

    @property
    def plan(self):
        """The step's ExecutionPlan (None: idle step)."""
        return None if self.prepared is None else self.prepared.plan


def chain(eng: Engine, req) -> list[int]:
    return eng.keys.chain(req.tokens, eng.config.page_size)


def spec_reuse(eng: Engine) -> dict[str, tuple[int, list[int]]]:
    """SPEC phase 2 by brute force, before the step's phase 1: who reuses how much, on which pages."""
    out: dict[str, tuple[int, list[int]]] = {}
    if not eng.rung.reuse:
        return out
    ps = eng.config.page_size
    for r in eng.requests:
        running = r.state is State.RUNNING or (r.state is State.WAITING and r.arrival_step <= eng.step_id)
        if not running or r.computed or r.page_table:
            continue
        cap = (r.prompt - 1) // ps
        if cap <= 0:
            continue
        hits = eng.cache.match(chain(eng, r), cap)[0]
        if hits:
            out[r.request_id] = (len(hits) * ps, list(hits))
    return out


def drive(eng):
    """Step `eng` to its end exactly as `Engine.run` does (idle step, or prepare, the
    executor, commit; then the progress check), yielding a `Step` after each one.
    Engine errors propagate, after the steps before them were yielded."""
    while not eng.done:
        assert eng.step_id < MAX_STEPS, f"no end after {MAX_STEPS} steps"
        before = view(eng)
        if eng.is_idle():
            trace = eng.idle_step()
            yield Step(eng, trace, before, view(eng))
        else:
            reuse = spec_reuse(eng)
            prepared = eng.prepare()
            mid = view(eng)
            trace = eng.commit(prepared, eng.executor.execute(prepared.plan))
            yield Step(eng, trace, before, view(eng), mid, prepared, reuse)
        eng.check_progress(trace)


def drive_all(eng, check=None):
    """All the steps and the error that ended the run (or None); `check(eng, step)` after each."""
    steps = []
    try:
        for s in drive(eng):
            steps.append(s)
            if check is not None:
                check(eng, s)
    except EngineError as e:
        return steps, e
    return steps, None


def plan_steps(workload, rung: str = "full", executor=None):
    """A new engine on `workload` at `rung` (default executor: LocalGroup), driven; yields each
    step that sent a plan once it passed `check_invariants`. A step that fails (Irreducible on
    a drawn workload, say) ends the run quietly."""
    eng = Engine(workload, executor, rung=rung)
    try:
        for s in drive(eng):
            if s.prepared is not None:
                check_invariants(eng)
                yield s
    except EngineError:
        return


def bounded(items):
    """An engine's step traces, or its SPEC §4 lines (the steps, then one more), failing the
    test past MAX_STEPS steps: `list(bounded(trace_objects(eng)))` is the engine's
    `trace_dicts(eng)` for a drawn workload that might not end."""
    for n, item in enumerate(items):
        assert n <= MAX_STEPS, f"no end after {MAX_STEPS} steps"
        yield item


# -- phase 4 from outside --------------------------------------------------------------------

def running_after_admission(s: Step) -> list[Snap]:
    """The requests RUNNING once phase 1 of the step is done, in request order."""
    admitted = set(s.trace.admitted)
    return sorted((x for rid, x in s.before.requests.items() if x.state is State.RUNNING or rid in admitted),
                  key=lambda x: x.index)


def replay_chunked(running: list[Snap], budget: int) -> list[tuple[int, int]]:
    """Phase 4 from outside: (request index, tokens), min(owed, budget left) in request order."""
    work = []
    for x in running:
        n = min(x.owed, budget)
        if n > 0:
            work.append((x.index, n))
            budget -= n
            if budget == 0:
                break
    return work


def replay_whole(running: list[Snap], budget: int) -> list[tuple[int, int]]:
    """Rung 02/03's phase 4 from outside: a request runs only if all it owes fits what is left."""
    work = []
    for x in running:
        if x.owed <= budget:
            work.append((x.index, x.owed))
            budget -= x.owed
    return work


def work_ids(eng, work) -> list[str]:
    return [eng.requests[i].request_id for i, _ in work]


def index_of(eng) -> dict:
    return {r.request_id: r.index for r in eng.requests}
