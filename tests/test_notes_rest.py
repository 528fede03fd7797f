"""The invariants of mechanism notes 07 to 12 (docs/mechanisms/07-prefix-hash.md ... 12-parallelism.md).

Each test carries the `invariant` marker of every note item it pins. Most
checks step a real `engine.Engine` phase by phase (prepare, execute, commit) over the
golden workloads and over small generated ones, and compare what the engine did with
a brute-force reading of SPEC §2-§3 computed from the state before the step. No mocks:
the executors are real LocalGroups (one test wraps one to record the plans it is
given) and, for parallelism, real worker processes.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from external import GOLDEN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import check_invariants

import inferris_dist
from inferris_dist.engine import (
    CACHE,
    BoundaryViolation,
    Engine,
    EngineError,
    ExecutionResult,
    GroupViolation,
    ItemOutcome,
    LocalGroup,
    RankExecutionResult,
    State,
    caching,
    join,
    load_workload,
    run_workload,
    trace_objects,
    verdict,
)
from inferris_dist.engine.boundary import validate
from inferris_dist.engine.messages import expand_placements
from inferris_dist.engine.pool import pages_needed
from inferris_dist.engine.prefix import ROOT_KEY, KeyTable, RadixCache
from inferris_dist.engine.rungs import CACHE_FIELDS
from inferris_dist.engine.shard import first_mismatch
from inferris_dist.engine.workload import Workload

pytestmark = pytest.mark.timeout(60)

GOLDEN_NAMES = sorted(p.name.removesuffix(".spec.json") for p in GOLDEN.glob("*.spec.json"))
CACHE_RUNGS = ("08a", "08b", "08c", "full")
# Deterministic: the same examples every run, and nothing written to a database.
FAST = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def golden(name: str):
    return load_workload(GOLDEN / f"{name}.spec.json")


def as_workload(workload) -> Workload:
    return workload if isinstance(workload, Workload) else load_workload(workload)


# -- stepping an engine phase by phase, with the state around each step ------------------------

@dataclass
class View:
    """What a test needs of the control plane at one moment, copied."""
    tables: dict[str, list[int]]
    computed: dict[str, int]
    generated: dict[str, int]
    state: dict[str, State]
    owner: list
    refs: list[int]
    free: list[int]
    paths: list[tuple[tuple[int, ...], int]]      # cache nodes in tree order: (keys from ROOT, page)
    drafts: dict[str, int]
    verdicts: dict[str, int]

    @property
    def path_set(self) -> set[tuple[int, ...]]:
        return {p for p, _ in self.paths}

    @property
    def page_of(self) -> dict[tuple[int, ...], int]:
        return dict(self.paths)


def cache_paths(cache: RadixCache) -> list[tuple[tuple[int, ...], int]]:
    """Every node as (its keys from ROOT, its page), in tree order."""
    path_of = {id(cache.root): ()}
    out = []
    for node in cache.tree_order():
        path = path_of[id(node.parent)] + (node.key,)
        path_of[id(node)] = path
        out.append((path, node.page))
    return out


def view(eng: Engine) -> View:
    reqs = eng.requests
    return View({r.request_id: list(r.page_table) for r in reqs},
                {r.request_id: r.computed for r in reqs},
                {r.request_id: r.generated for r in reqs},
                {r.request_id: r.state for r in reqs},
                list(eng.pool.owner), list(eng.pool.refs), eng.pool.free_pages(),
                cache_paths(eng.cache),
                {r.request_id: r.draft_len for r in reqs},
                {r.request_id: r.num_verdicts for r in reqs})


@dataclass
class Step:
    eng: Engine
    step: int
    before: View          # after the previous commit
    reuse: dict           # SPEC phase 2 computed from `before`: rid -> (computed, hit pages)
    prepared: object      # phases 1-6
    mid: View             # when the plan goes out
    result: ExecutionResult
    trace: object
    after: View
    extra: dict = field(default_factory=dict)


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


MAX_STEPS = 2000      # every workload here ends far sooner (the longest golden: 530 steps)


def drive(workload, rung: str = "full", executor=None, check=True):
    """Step an engine as `Engine.run` does; yield a `Step` per step that sends a plan.

    Stops quietly when a step fails (Irreducible on a generated workload, say).
    With `check`, every committed step must pass tests/invariants.py. A run that has
    not ended after MAX_STEPS steps fails the test (SPEC §5: a run that never ends).
    """
    eng = Engine(workload, executor, rung=rung)
    while not eng.done:
        assert eng.step_id < MAX_STEPS, f"the run has not ended after {MAX_STEPS} steps"
        if eng.is_idle():
            eng.idle_step()
            continue
        before = view(eng)
        reuse = spec_reuse(eng)
        try:
            prepared = eng.prepare()
            mid = view(eng)
            result = eng.executor.execute(prepared.plan)
            trace = eng.commit(prepared, result)
        except EngineError:
            return
        if check:
            check_invariants(eng)
        yield Step(eng, prepared.step, before, reuse, prepared, mid, result, trace, view(eng))


def run_workload_at(workload, rung="full"):
    """The SPEC §4 lines of a run at a rung (steps, then summary or error), bounded."""
    lines = []
    for line in trace_objects(Engine(workload, rung=rung)):
        lines.append(line)
        assert len(lines) <= MAX_STEPS + 1, f"the run has not ended after {MAX_STEPS} steps"
    return lines


def bounded(traces):
    """`engine.run()`, failing the test if the run does not end within MAX_STEPS steps."""
    for n, trace in enumerate(traces):
        assert n < MAX_STEPS, f"the run has not ended after {MAX_STEPS} steps"
        yield trace


# -- generated workloads: shared prompt prefixes, small pools, drafts ----------------------------

@st.composite
def workloads(draw, spec=True):
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
                       "spec_len": draw(st.integers(0, 3)) if spec else 0},
            "requests": requests}


# =============================================================================================
# 07 prefix hash
# =============================================================================================

token_lists = st.lists(st.integers(0, 2), max_size=14)


@pytest.mark.invariant("prefix-hash/1")
@FAST
@given(tokens=token_lists, ps=st.integers(1, 5))
def test_only_complete_blocks_have_keys(tokens, ps):
    keys = KeyTable().chain(tuple(tokens), ps)
    assert len(keys) == len(tokens) // ps


@pytest.mark.invariant("prefix-hash/2")
@FAST
@given(a=token_lists, b=token_lists, ps=st.integers(1, 4))
def test_equal_keys_exactly_when_equal_prefixes(a, b, ps):
    table = KeyTable()
    ka, kb = table.chain(tuple(a), ps), table.chain(tuple(b), ps)
    for j in range(min(len(ka), len(kb))):
        same_prefix = a[:(j + 1) * ps] == b[:(j + 1) * ps]
        assert (ka[j] == kb[j]) == same_prefix, (j, a, b)


@pytest.mark.invariant("prefix-hash/3")
@FAST
@given(tokens=token_lists, other=token_lists, ps=st.integers(1, 4))
def test_chains_are_stable_and_prefix_closed(tokens, other, ps):
    table = KeyTable()
    full = table.chain(tuple(tokens), ps)
    table.chain(tuple(other), ps)                          # asking about others changes nothing
    assert table.chain(tuple(tokens), ps) == full
    for k in range(len(full) + 1):
        assert table.chain(tuple(tokens[:k * ps]), ps) == full[:k]
    # The relation does not depend on who asked first: a fresh table in the other order agrees.
    fresh = KeyTable()
    fresh_other = fresh.chain(tuple(other), ps)
    fresh_full = fresh.chain(tuple(tokens), ps)
    for i, j in itertools.product(range(len(full)), range(len(fresh_other))):
        assert (fresh_full[i] == fresh_other[j]) == (full[i] == table.chain(tuple(other), ps)[j])


@pytest.mark.invariant("prefix-hash/4")
@FAST
@given(tokens=token_lists, ps=st.integers(1, 4))
def test_no_key_is_root_and_a_chain_never_repeats_a_key(tokens, ps):
    keys = KeyTable().chain(tuple(tokens), ps)
    assert ROOT_KEY not in keys
    assert len(set(keys)) == len(keys)            # same block tokens at another depth: another key


@pytest.mark.invariant("prefix-hash/4")
def test_repeated_block_at_two_depths():
    k0, k1, k2 = KeyTable().chain((5, 5, 5, 5, 5, 5), 2)
    assert len({k0, k1, k2}) == 3


@pytest.mark.invariant("prefix-hash/5")
@pytest.mark.parametrize("name", ["prefix_reuse", "cache_eviction", "random_009", "random_017",
                                  "random_038", "recompute_window"])
def test_engine_keys_every_prompt_in_one_table(name):
    wl = golden(name)
    eng = Engine(wl)
    for _ in bounded(eng.run()):
        pass
    ps = eng.config.page_size
    keyed = [r for r in eng.requests if r.prefix_keys is not None]
    for r in keyed:
        # only the prompt is keyed, however much the request generated or was preempted
        assert len(r.prefix_keys) == r.prompt // ps
        assert r.prefix_keys == eng.keys.chain(r.tokens, ps)
    for r, s in itertools.combinations(keyed, 2):
        for j in range(min(len(r.prefix_keys), len(s.prefix_keys))):
            assert (r.prefix_keys[j] == s.prefix_keys[j]) == (
                r.tokens[:(j + 1) * ps] == s.tokens[:(j + 1) * ps])


@pytest.mark.invariant("prefix-hash/5")
def test_prefix_reuse_keys_by_tokens_not_by_request():
    eng = Engine(golden("prefix_reuse"))
    for _ in bounded(eng.run()):
        pass
    k = {r.request_id: caching.prefix_keys(r, eng.keys, 4) for r in eng.requests}
    assert k["first"] == k["same"] and len(k["first"]) == 3           # 14 tokens: 3 blocks
    assert k["branch"][:2] == k["first"][:2] and k["branch"][2] != k["first"][2]
    assert k["exact"] == k["first"][:2]
    assert set(k["stranger"]).isdisjoint(k["first"] + k["branch"])


# =============================================================================================
# 08 radix cache: a brute-force model of the tree, driven the way the engine drives the cache
# =============================================================================================

class Model:
    """The SPEC's tree as plain dicts: path (keys from ROOT) -> page, children in insertion order."""

    def __init__(self):
        self.page: dict[tuple[int, ...], int] = {}
        self.kids: dict[tuple[int, ...], list[int]] = {(): []}

    def preorder(self):
        out = []

        def walk(path):
            for key in self.kids[path]:
                child = path + (key,)
                out.append(child)
                walk(child)
        walk(())
        return out

    def match(self, keys, limit):
        pages = []
        for i in range(limit):
            path = tuple(keys[:i + 1])
            if path not in self.page:
                break
            pages.append(self.page[path])
        return pages

    def insert(self, keys, pages):
        for i, page in enumerate(pages):
            path = tuple(keys[:len(keys) - len(pages) + i + 1])
            assert path not in self.page
            self.page[path] = page
            self.kids[path[:-1]].append(path[-1])
            self.kids[path] = []

    def first_evictable(self, refs):
        for path in self.preorder():
            if not self.kids[path] and refs[self.page[path]] == 0:
                return path
        return None

    def remove(self, path):
        del self.page[path]
        del self.kids[path]
        self.kids[path[:-1]].remove(path[-1])


NUM_TEST_PAGES = 24
ops = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.lists(st.integers(1, 3), min_size=1, max_size=4), st.booleans()),
    st.tuples(st.just("map"), st.integers(0, NUM_TEST_PAGES - 1)),
    st.tuples(st.just("unmap"), st.integers(0, NUM_TEST_PAGES - 1)),
    st.tuples(st.just("evict")),
    st.tuples(st.just("match"), st.lists(st.integers(1, 3), max_size=5), st.integers(0, 5)),
), max_size=40)


def play(op_list, check):
    """Drive a RadixCache and the Model side by side, as publish / reuse / residency do."""
    cache, model = RadixCache(), Model()
    refs = [0] * NUM_TEST_PAGES
    free = list(range(NUM_TEST_PAGES))
    for op in op_list:
        kind = op[0]
        if kind == "insert":                 # publish: match, then hang the missing blocks below
            _, keys, mapped = op
            _, node, depth = cache.match(keys, len(keys))
            assert depth == len(model.match(keys, len(keys)))
            missing = len(keys) - depth
            if missing == 0 or missing > len(free):
                continue
            pages = [free.pop(0) for _ in range(missing)]
            for p in pages:
                refs[p] = 1 if mapped else 0
            cache.insert_below(node, keys[depth:], pages, refs)
            model.insert(keys, pages)
        elif kind == "map":                  # reuse maps a cache page
            p = op[1]
            if p in model.page.values():
                refs[p] += 1
        elif kind == "unmap":                # a page table lets go of it
            p = op[1]
            if p in model.page.values() and refs[p] > 0:
                refs[p] -= 1
                if refs[p] == 0:
                    cache.note_unreferenced(p)
        elif kind == "evict":
            want = model.first_evictable(refs)
            got = cache.evict_one(refs)
            check("evict", cache, model, refs, want=want, got=got)
            if want is not None:
                free.append(model.page[want])
                model.remove(want)
        elif kind == "match":
            _, keys, limit = op
            limit = min(limit, len(keys))
            check("match", cache, model, refs, got=cache.match(keys, limit)[0],
                  want=model.match(keys, limit))
        check("state", cache, model, refs)
    return cache, model


def no_check(*a, **k):
    pass


@pytest.mark.invariant("radix-cache/1")
@FAST
@given(op_list=ops)
def test_match_is_the_longest_present_run_from_root(op_list):
    def check(what, cache, model, refs, want=None, got=None):
        if what == "match":
            assert got == want
    play(op_list, check)


@pytest.mark.invariant("radix-cache/2")
@FAST
@given(op_list=ops, keys=st.lists(st.integers(1, 3), min_size=1, max_size=5))
def test_insert_keeps_resident_nodes_and_appends_the_rest(op_list, keys):
    cache, model = play(op_list, no_check)
    before = {path: page for path, page in cache_paths(cache)}
    refs = [1] * 64
    pages, node, depth = cache.match(keys, len(keys))
    new_pages = list(range(40, 40 + len(keys) - depth))
    cache.insert_below(node, keys[depth:], new_pages, refs)
    after = dict(cache_paths(cache))
    assert cache.match(keys, len(keys))[0] == pages + new_pages
    for path, page in before.items():                     # nothing resident moved or changed page
        assert after[path] == page
    assert len(after) == len(before) + len(new_pages)


@pytest.mark.invariant("radix-cache/3")
@FAST
@given(op_list=ops)
def test_tree_order_is_preorder_children_in_insertion_order(op_list):
    def check(what, cache, model, refs, want=None, got=None):
        if what == "state":
            assert [p for p, _ in cache_paths(cache)] == model.preorder()
    play(op_list, check)


@pytest.mark.invariant("radix-cache/4")
@FAST
@given(op_list=ops)
def test_one_page_per_node(op_list):
    def check(what, cache, model, refs, want=None, got=None):
        if what == "state":
            paths = cache_paths(cache)
            pages = [p for _, p in paths]
            assert len(pages) == len(set(pages)) == len(cache)
            assert set(cache.node_of_page) == set(pages)
            assert dict(paths) == model.page
    play(op_list, check)


@pytest.mark.invariant("radix-cache/5")
@FAST
@given(op_list=ops)
def test_evict_takes_the_first_unmapped_leaf_in_tree_order(op_list):
    def check(what, cache, model, refs, want=None, got=None):
        if what == "evict":
            assert got == (None if want is None else model.page[want])
    play(op_list, check)


@pytest.mark.invariant("radix-cache/2")
@pytest.mark.invariant("radix-cache/4")
@pytest.mark.parametrize("rung", CACHE_RUNGS)
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_engine_cache_nodes_are_the_cache_pages_and_keep_them(name, rung):
    for s in drive(golden(name), rung):
        evicted = set(s.trace.evicted)
        for when in (s.mid, s.after):
            cache_owned = {p for p, o in enumerate(when.owner) if o is CACHE}
            assert {page for _, page in when.paths} == cache_owned
            assert len(when.paths) == len(cache_owned)
        # first publisher wins: a path present before and after keeps its page, unless evicted
        before, after = s.before.page_of, s.after.page_of
        for path, page in before.items():
            if path in after and page not in evicted:
                assert after[path] == page


@pytest.mark.invariant("radix-cache/2")
def test_first_publisher_wins_in_the_engine():
    eng = Engine(golden("prefix_reuse"), rung="08a")      # 08a publishes but never reads
    traces = list(bounded(eng.run()))
    same = next(t for t in traces if "same" in t.executed and t.executed["same"] == 14)
    assert same.published == {}                           # `first` holds all three blocks
    first_pages = eng.cache.match(eng.keys.chain(eng.by_id["first"].tokens, 4), 3)[0]
    assert first_pages == [0, 1, 2]


# =============================================================================================
# 09 cache-aware scheduling
# =============================================================================================

def check_reuse(s: Step) -> None:
    want = {rid: c for rid, (c, _) in s.reuse.items()}
    assert s.prepared.reused == want
    assert list(s.prepared.reused) == list(want)        # in request order
    ps = s.eng.config.page_size
    for rid, (c, hits) in s.reuse.items():
        req = s.eng.by_id[rid]
        assert c % ps == 0 and 0 < c < req.prompt
        if rid not in s.prepared.preempted:
            assert s.mid.tables[rid][:len(hits)] == hits
            assert s.mid.computed[rid] == c
            assert all(s.mid.owner[p] is CACHE for p in hits)


def check_publish(s: Step) -> None:
    eng, ps = s.eng, s.eng.config.page_size
    present = set(s.mid.path_set)
    want, new_pages = {}, {}
    for req, _, _ in s.prepared.work:
        keys = chain(eng, req)
        complete = min(s.after.computed[req.request_id], req.prompt) // ps
        resident = 0
        while resident < complete and tuple(keys[:resident + 1]) in present:
            resident += 1
        if complete > resident:
            want[req.request_id] = complete - resident
        for d in range(resident + 1, complete + 1):
            present.add(tuple(keys[:d]))
            new_pages[tuple(keys[:d])] = s.mid.tables[req.request_id][d - 1]
    assert s.trace.published == want
    assert s.after.path_set == present
    if eng.rung.publish:
        page_of = s.after.page_of
        for path, page in new_pages.items():
            assert page_of[path] == page          # the publisher's own page became the cache's
            assert s.after.owner[page] is CACHE
    assert len(s.after.paths) == len(s.mid.paths) + sum(want.values())


def mapped_pre5(s: Step) -> dict[str, list[int]]:
    """Each request's page table when phase 5 begins: as before the step, or the reused hit."""
    out = {rid: list(t) for rid, t in s.before.tables.items()}
    for rid, (_, hits) in s.reuse.items():
        out[rid] = list(hits)
    return out


def check_eviction_safe(s: Step) -> None:
    tables = mapped_pre5(s)
    kept = {p for rid, t in tables.items() if rid not in s.prepared.preempted for p in t}
    before_cache = {page for _, page in s.before.paths}
    for p in s.trace.evicted:
        assert s.before.owner[p] is CACHE and p in before_cache
        assert p not in kept, f"step {s.step}: evicted page {p} is mapped"
    assert len(set(s.trace.evicted)) == len(s.trace.evicted)


def brute_force_evictions(paths, mapped):
    """SPEC phase 5's eviction order: the first unmapped leaf in tree order, again and again."""
    paths = list(paths)
    while True:
        alive = {p for p, _ in paths}
        for i, (path, page) in enumerate(paths):
            leaf = not any(q[:len(path)] == path and len(q) > len(path) for q in alive)
            if leaf and page not in mapped:
                yield page
                del paths[i]
                break
        else:
            return


def check_eviction_minimal(s: Step) -> None:
    if s.prepared.preempted:
        return
    eng, ps = s.eng, s.eng.config.page_size
    tables = mapped_pre5(s)
    shortfall = sum(max(0, pages_needed(s.mid.computed[req.request_id] + n, ps)
                        - len(tables[req.request_id])) for req, n, _ in s.prepared.work)
    evicted = s.trace.evicted
    if "evict" in eng.rung.reliefs:
        assert len(evicted) == max(0, shortfall - len(s.before.free))
        mapped = {p for t in tables.values() for p in t}
        assert evicted == list(itertools.islice(brute_force_evictions(s.before.paths, mapped),
                                                len(evicted)))
    else:
        assert evicted == []


def check_evict_before_preempt(s: Step) -> None:
    if not s.prepared.preempted:
        return
    if "evict" not in s.eng.rung.reliefs:
        assert s.trace.evicted == []
        return
    tables = mapped_pre5(s)
    victims = {p for rid in s.prepared.preempted for p in tables[rid]}
    mapped_now = {p for rid, t in s.mid.tables.items() if s.mid.state[rid] is not State.FINISHED
                  for p in t}
    paths = s.mid.path_set
    for path, page in s.mid.paths:
        leaf = not any(len(q) == len(path) + 1 and q[:-1] == path for q in paths)
        if leaf and page not in mapped_now:
            assert page in victims, (f"step {s.step}: preempted {s.prepared.preempted} while "
                                     f"cache leaf page {page} was evictable")


def check_only_prompt_blocks(s: Step) -> None:
    chains = [tuple(chain(s.eng, r)) for r in s.eng.requests]
    for path, _ in s.after.paths:
        assert any(c[:len(path)] == path for c in chains), f"cache path {path} is no prompt prefix"


CACHE_CHECKS = [check_reuse, check_publish, check_eviction_safe, check_eviction_minimal,
                check_evict_before_preempt, check_only_prompt_blocks]


def check_cache_steps(workload, rung):
    n = 0
    for s in drive(workload, rung):
        for c in CACHE_CHECKS:
            c(s)
        n += 1
    return n


@pytest.mark.invariant("cache-aware-scheduling/1")
@pytest.mark.invariant("cache-aware-scheduling/2")
@pytest.mark.invariant("cache-aware-scheduling/3")
@pytest.mark.invariant("cache-aware-scheduling/4")
@pytest.mark.invariant("cache-aware-scheduling/5")
@pytest.mark.invariant("cache-aware-scheduling/6")
@pytest.mark.parametrize("rung", CACHE_RUNGS)
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_cache_decisions_on_golden_workloads(name, rung):
    check_cache_steps(golden(name), rung)


@pytest.mark.invariant("cache-aware-scheduling/1")
@pytest.mark.invariant("cache-aware-scheduling/2")
@pytest.mark.invariant("cache-aware-scheduling/3")
@pytest.mark.invariant("cache-aware-scheduling/4")
@pytest.mark.invariant("cache-aware-scheduling/5")
@pytest.mark.invariant("cache-aware-scheduling/6")
@FAST
@given(wl=workloads(), rung=st.sampled_from(CACHE_RUNGS))
def test_cache_decisions_on_generated_workloads(wl, rung):
    check_cache_steps(wl, rung)


@pytest.mark.invariant("cache-aware-scheduling/1")
def test_reuse_counts_on_prefix_reuse():
    lines = run_workload_at(golden("prefix_reuse"), "08b")
    reused = {k: v for line in lines[:-1] for k, v in line["reused"].items()}
    # same: 3 blocks hit, 13 // 4 = 3 usable; branch: 2 hit; exact: 2 hit, only (8-1)//4 = 1 usable
    assert reused == {"same": 12, "branch": 8, "exact": 4}
    assert all(line["reused"] == {} for line in run_workload_at(golden("prefix_reuse"), "08a")[:-1])


@pytest.mark.invariant("cache-aware-scheduling/1")
def test_a_preempted_request_keeps_its_cache_hit():
    wl = {"engine": {"max_step_tokens": 4, "page_size": 2, "num_pages": 5},
          "requests": [{"request_id": "a", "tokens": [1, 2, 3, 4, 5], "max_new_tokens": 3},
                       {"request_id": "b", "tokens": [7, 7, 7, 7, 7, 7], "max_new_tokens": 1,
                        "arrival_step": 1}]}
    steps = list(drive(wl, "08b"))
    pre = [s for s in steps if s.prepared.preempted]
    assert pre, "the workload no longer preempts"
    for s in steps:
        check_reuse(s)
    victim = pre[0].prepared.preempted[0]
    later = [s for s in steps if s.step > pre[0].step and victim in s.prepared.reused]
    assert later, f"{victim} never reused its published blocks after preemption"


@pytest.mark.invariant("cache-aware-scheduling/5")
def test_pressure_evicts_at_08c_where_08b_runs_out():
    lines = run_workload_at(golden("cache_eviction"), "08b")
    assert lines[-1]["error"] == "OutOfPages" and lines[-1]["step"] == 4
    lines = run_workload_at(golden("cache_eviction"), "08c")
    assert [line["evicted"] for line in lines[:-1]][4] == [2, 4]
    assert all(line["preempted"] == [] for line in lines[:-1])


# =============================================================================================
# 10 speculative decoding
# =============================================================================================

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
    for s in drive(workload, rung):
        checker.all(s)
        eng = s.eng
    if eng is not None:
        final_generated_ok(eng)


SPEC_GOLDENS = [n for n in GOLDEN_NAMES if golden(n).config.spec_len > 0]


@pytest.mark.invariant("speculative-decoding/1")
@pytest.mark.invariant("speculative-decoding/2")
@pytest.mark.invariant("speculative-decoding/3")
@pytest.mark.invariant("speculative-decoding/4")
@pytest.mark.invariant("speculative-decoding/5")
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_speculation_on_golden_workloads(name):
    check_spec_run(golden(name))


@pytest.mark.invariant("speculative-decoding/1")
@pytest.mark.invariant("speculative-decoding/2")
@pytest.mark.invariant("speculative-decoding/3")
@pytest.mark.invariant("speculative-decoding/4")
@pytest.mark.invariant("speculative-decoding/5")
@FAST
@given(wl=workloads())
def test_speculation_on_generated_workloads(wl):
    check_spec_run(wl)


@pytest.mark.invariant("speculative-decoding/1")
def test_no_drafts_below_full():
    for rung in ("05", "08c"):
        for s in drive(golden("speculative"), rung):
            assert all(i.draft_len == 0 for i in s.prepared.plan.items)


@pytest.mark.invariant("speculative-decoding/1")
def test_recompute_after_preemption_is_not_a_window():
    # SPEC §5: step 8 of recompute_window recomputes 15 positions of q6 with no verdict
    checker = SpecChecker(golden("recompute_window"))
    seen = False
    for s in drive(golden("recompute_window")):
        checker.draft_rule(s)
        if s.step == 8:
            item = next(i for i in s.prepared.plan.items if i.request_id == "q6")
            assert item.num_tokens == 15 and not item.decode and item.draft_len == 0
            seen = True
    assert seen


@pytest.mark.invariant("speculative-decoding/5")
@pytest.mark.parametrize("name", SPEC_GOLDENS + ["demo", "preemption"])
def test_speculation_changes_no_summary(name):
    wl = golden(name)
    with_drafts, without = run_workload_at(wl, "full"), run_workload_at(wl, "08c")
    if "summary" in with_drafts[-1] and "summary" in without[-1]:
        assert with_drafts[-1] == without[-1]
    # and with spec_len 0 the full engine is the 08c engine, field for field
    plain = run_workload_at(wl.with_config(spec_len=0), "full")
    assert [{k: line[k] for k in CACHE_FIELDS} if "step" in line else line for line in plain] == \
        run_workload_at(wl.with_config(spec_len=0), "08c")


# =============================================================================================
# 11 executor boundary
# =============================================================================================

def check_plan_mirrors_state(s: Step) -> None:
    ps = s.eng.config.page_size
    items = s.prepared.plan.items
    assert s.prepared.plan.step == s.step
    assert [i.request_id for i in items] == [r for r in s.prepared.scheduled
                                            if r not in s.prepared.preempted]
    assert [i.request_id for i in items] == [req.request_id for req, _, _ in s.prepared.work]
    for item in items:
        rid = item.request_id
        table = s.mid.tables[rid]
        assert item.start_position == s.mid.computed[rid]
        assert item.draft_len == s.mid.drafts[rid]
        assert item.verdict_index == s.mid.verdicts[rid]
        start, n = item.start_position, item.num_tokens
        assert list(item.placements) == table[start // ps:(start + n - 1) // ps + 1]
        assert expand_placements(start, n, item.placements, ps) == [
            (p, table[p // ps], p % ps) for p in range(start, start + n)]


def mutations(plan, result, num_pages):
    """Results that differ from the honest one in one way each; every one must be refused."""
    outs = list(result.outcomes)
    yield "step", result._replace(step=result.step + 1)
    yield "drop", result._replace(outcomes=tuple(outs[:-1]))
    yield "extra", result._replace(outcomes=tuple(outs + [outs[-1]]))
    if len(outs) > 1:
        yield "swap", result._replace(outcomes=tuple([outs[1], outs[0]] + outs[2:]))
    for i, (item, out) in enumerate(zip(plan.items, outs)):
        def one(**kw):
            changed = list(outs)
            changed[i] = out._replace(**kw)
            return result._replace(outcomes=tuple(changed))
        yield f"{i}.id", one(request_id=out.request_id + "x")
        yield f"{i}.start+", one(start_position=out.start_position + 1)
        yield f"{i}.start-", one(start_position=out.start_position - 1)
        yield f"{i}.n+", one(executed_tokens=out.executed_tokens + 1)
        yield f"{i}.n-", one(executed_tokens=out.executed_tokens - 1)
        yield f"{i}.acc-", one(accepted=-1)
        yield f"{i}.acc-high", one(accepted=item.num_tokens if item.decode else 1)
        yield f"{i}.writes-short", one(writes=out.writes[:-1])
        yield f"{i}.writes-long", one(writes=out.writes + ((out.writes[-1] + 1) % num_pages,))
        yield f"{i}.writes-moved", one(writes=((out.writes[0] + 1) % num_pages,) + out.writes[1:])
        if len(out.writes) > 1:
            yield f"{i}.writes-reversed", one(writes=out.writes[::-1])


@pytest.mark.invariant("executor-boundary/1")
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_plan_is_read_off_the_control_plane(name):
    for s in drive(golden(name)):
        check_plan_mirrors_state(s)


@pytest.mark.invariant("executor-boundary/1")
@FAST
@given(wl=workloads())
def test_plan_is_read_off_the_control_plane_generated(wl):
    for s in drive(wl):
        check_plan_mirrors_state(s)


@pytest.mark.invariant("executor-boundary/2")
@pytest.mark.invariant("executor-boundary/3")
@pytest.mark.parametrize("name", ["speculative", "demo", "preemption", "cache_eviction",
                                  "recompute_window", "spec_budget_cut", "random_009"])
def test_every_mismatch_is_refused_and_commits_nothing(name):
    eng = Engine(golden(name))
    num_pages = eng.config.num_pages
    refused = 0
    while not eng.done:
        if eng.is_idle():
            eng.idle_step()
            continue
        prepared = eng.prepare()
        planned = eng.snapshot()
        honest = eng.executor.execute(prepared.plan)
        assert eng.snapshot() == planned                   # executing touched no control state
        for what, bad in mutations(prepared.plan, honest, num_pages):
            with pytest.raises(BoundaryViolation):
                eng.commit(prepared, bad)
            assert eng.snapshot() == planned, f"{what} at step {prepared.step} committed something"
            refused += 1
        # any in-range verdict is a legal answer: it passes validation
        for item, out in zip(prepared.plan.items, honest.outcomes):
            for acc in range(item.num_tokens if item.decode else 1):
                outs = [o if o is not out else out._replace(accepted=acc) for o in honest.outcomes]
                validate(prepared.plan, honest._replace(outcomes=tuple(outs)))
        eng.commit(prepared, honest)
    assert refused > 0


@pytest.mark.invariant("executor-boundary/2")
@FAST
@given(data=st.data())
def test_random_accepted_values_pass_exactly_in_range(data):
    eng = Engine(golden("speculative"))
    eng.step()
    prepared = eng.prepare()                               # step 1: two decode items
    honest = eng.executor.execute(prepared.plan)
    i = data.draw(st.integers(0, len(honest.outcomes) - 1))
    acc = data.draw(st.integers(-3, 8))
    item = prepared.plan.items[i]
    outs = list(honest.outcomes)
    outs[i] = outs[i]._replace(accepted=acc)
    ok = 0 <= acc <= (item.num_tokens - 1 if item.decode else 0)
    if ok:
        validate(prepared.plan, honest._replace(outcomes=tuple(outs)))
    else:
        with pytest.raises(BoundaryViolation):
            validate(prepared.plan, honest._replace(outcomes=tuple(outs)))


class Recording:
    """A real LocalGroup; every plan it is handed is kept."""

    def __init__(self, workload):
        self.inner = LocalGroup(as_workload(workload))
        self.plans = []

    def execute(self, plan):
        self.plans.append(plan)
        return self.inner.execute(plan)


@pytest.mark.invariant("executor-boundary/4")
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_one_plan_per_step_that_runs_anything(name):
    wl = golden(name)
    rec = Recording(wl)
    eng = Engine(wl, rec)
    traces = []
    try:
        for t in bounded(eng.run()):
            traces.append(t)
    except EngineError:
        pass
    committed = [t for t in traces if t.executed]
    assert all(not t.scheduled and not t.admitted for t in traces if not t.executed)
    plans = rec.plans[:len(committed)]
    assert [p.step for p in plans] == [t.step for t in committed]
    for p, t in zip(plans, committed):
        assert [i.request_id for i in p.items] == list(t.executed)
        assert [i.num_tokens for i in p.items] == list(t.executed.values())
    # a failed step (Irreducible fails before its plan) never adds a plan for an idle step
    assert len(rec.plans) in (len(committed), len(committed) + 1)
    assert len({p.step for p in rec.plans}) == len(rec.plans)


# =============================================================================================
# 12 parallelism: rank groups
# =============================================================================================

OUT = (ItemOutcome("a", 4, 3, 1, (0, 1)), ItemOutcome("b", 0, 2, 0, (2,)))


@pytest.mark.invariant("parallelism/1")
@FAST
@given(n=st.integers(1, 4), ranks=st.lists(st.integers(0, 5), max_size=6),
       sizes=st.lists(st.integers(1, 5), min_size=6, max_size=6),
       steps=st.lists(st.sampled_from([7, 7, 7, 8]), min_size=6, max_size=6))
def test_join_needs_every_rank_once_naming_the_group(n, ranks, sizes, steps):
    results = [RankExecutionResult(r, sizes[i], steps[i], OUT) for i, r in enumerate(ranks)]
    ok = (sorted(ranks) == list(range(n)) and all(sizes[i] == n for i in range(len(ranks)))
          and all(steps[i] == 7 for i in range(len(ranks))))
    if ok:
        assert join(results, n, 7) == ExecutionResult(7, OUT)
    else:
        with pytest.raises(GroupViolation):
            join(results, n, 7)


@pytest.mark.invariant("parallelism/1")
def test_join_examples():
    good = [RankExecutionResult(r, 3, 7, OUT) for r in (2, 0, 1)]
    assert join(good, 3, 7) == ExecutionResult(7, OUT)             # arrival order is irrelevant
    for bad in (good[:2], good + [good[0]], [r._replace(world_size=4) for r in good]):
        with pytest.raises(GroupViolation):
            join(bad, 3, 7)


@pytest.mark.invariant("parallelism/2")
@FAST
@given(n=st.integers(2, 5), data=st.data())
def test_no_majority_vote(n, data):
    odd = data.draw(st.integers(0, n - 1))
    i = data.draw(st.integers(0, len(OUT) - 1))
    fld = data.draw(st.sampled_from(ItemOutcome._fields))
    value = {"request_id": "z", "start_position": 5, "executed_tokens": 9, "accepted": 2,
             "writes": (3,)}[fld]
    changed = list(OUT)
    changed[i] = changed[i]._replace(**{fld: value})
    if tuple(changed) == OUT:
        return
    results = [RankExecutionResult(r, n, 7, tuple(changed) if r == odd else OUT) for r in range(n)]
    with pytest.raises(GroupViolation):
        join(results, n, 7)
    with pytest.raises(GroupViolation):                  # also with a missing outcome
        join([RankExecutionResult(r, n, 7, OUT[:1] if r == odd else OUT) for r in range(n)], n, 7)


def comparable(lines):
    return [{"error": x["error"], "step": x["step"]} if "error" in x else x for x in lines]


@pytest.mark.invariant("parallelism/3")
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_world_size_changes_no_trace_in_process(name):
    wl = golden(name)
    want = comparable(run_workload(wl.with_config(world_size=1)))
    for n in (2, 3, 5):
        assert comparable(run_workload(wl.with_config(world_size=n))) == want, n


@pytest.mark.invariant("parallelism/3")
@pytest.mark.invariant("parallelism/4")
@pytest.mark.parametrize("name", ["speculative", "cache_eviction"])
def test_world_size_changes_no_trace_on_processes(name):
    wl = golden(name)
    want = run_workload(wl.with_config(world_size=1))
    lines = []
    with inferris_dist.launch(wl, world_size=3, audit_every=1) as eng:   # audit every shard each step
        for t in eng.run():
            lines.append(t.to_json())
        lines.append({"summary": eng.summary()})
    assert lines == want


@pytest.mark.invariant("parallelism/4")
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_every_shard_holds_the_pool(name):
    wl = golden(name)
    group = LocalGroup(wl, 3)
    for s in drive(wl, executor=group):
        shards = group.shards()
        assert sorted(shards) == [0, 1, 2]
        for r, snap in shards.items():
            assert first_mismatch(s.eng.pool.slots, dict(snap)) is None, (r, s.step)
        assert shards[0] == shards[1] == shards[2]


SPECULATIVE_3 = {
    "engine": {"max_step_tokens": 16, "page_size": 4, "num_pages": 8, "spec_len": 3, "world_size": 3},
    "requests": [{"request_id": "r", "prompt_len": 4, "max_new_tokens": 6, "accept_script": [2]},
                 {"request_id": "s", "prompt_len": 6, "max_new_tokens": 2}],
}


@pytest.mark.invariant("parallelism/5")
def test_a_split_group_commits_nothing():
    wl = load_workload(SPECULATIVE_3)
    other = dict(SPECULATIVE_3, requests=[dict(SPECULATIVE_3["requests"][0], accept_script=[0]),
                                          SPECULATIVE_3["requests"][1]])
    group = LocalGroup(wl)
    group.ranks[2] = LocalGroup(load_workload(other)).ranks[2]    # a real rank with another verdict
    eng = Engine(wl, group)
    eng.step()                                                     # prefill: no verdict, all agree
    prepared = eng.prepare()
    planned = eng.snapshot()
    with pytest.raises(GroupViolation):
        group.execute(prepared.plan)
    assert eng.snapshot() == planned
    lines = run_workload(wl, _split_group(wl, other))
    assert lines[-1]["error"] == "GroupViolation" and lines[-1]["step"] == 1 and len(lines) == 2


def _split_group(wl, other):
    group = LocalGroup(wl)
    group.ranks[2] = LocalGroup(load_workload(other)).ranks[2]
    return group


@pytest.mark.invariant("parallelism/5")
def test_a_disagreeing_worker_process_commits_nothing():
    wl = load_workload(SPECULATIVE_3)
    reference = Engine(wl)
    reference.step()
    reference.prepare()                                  # where the control plane stands at step 1
    lines = []
    with inferris_dist.launch(wl, world_size=3, faults=["1:disagree@1"]) as eng:
        with pytest.raises(GroupViolation) as info:
            for t in eng.run():
                lines.append(t.to_json())
        assert info.value.step == 1
        assert eng.snapshot() == reference.snapshot()
    assert len(lines) == 1
