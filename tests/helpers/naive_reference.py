#!/usr/bin/env python3
"""Naive, deliberately literal reference implementation of docs/SPEC.md.

Used as a test oracle against the fast engine.  Written from the spec text
only: stdlib only, no project imports, clarity over speed.  Every phase of
SPEC §3 is a separate block below, in order, quoting the rule it implements.

    python tests/helpers/naive_reference.py path/to/spec.json

prints the trace as JSON lines (SPEC §4) and exits 1 if the run ended in an
error, else 0.  world_size is ignored: every rank computes the same outcome,
so the join (phase 8) and the boundary validation (phase 9) always pass.
"""
import json
import sys

# §1 defaults for the `engine` object.
ENGINE_DEFAULTS = {
    "max_step_tokens": 8,
    "page_size": 4,
    "num_pages": 8,
    "spec_len": 0,
    "world_size": 1,
}

# §2: "The namespace is one constant for the whole engine."
NAMESPACE = "inferris"
# §2: "key of block j-1 or ROOT"
ROOT = "ROOT"

CACHE = "<cache>"  # page owner marker for cache-owned pages
NOBODY = None      # page owner marker for free pages


class EngineFailure(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind
        self.message = message


def pages_needed(t, page_size):
    # §2: pages_needed(t) = ceil(t / page_size)
    return -(-t // page_size)


class Request:
    def __init__(self, index, raw):
        self.request_id = raw["request_id"]
        if raw.get("tokens") is not None:
            self.tokens = list(raw["tokens"])
        else:
            # §1: prompt_len at list index i gets 1000*i .. 1000*i+prompt_len-1
            self.tokens = [1000 * index + k for k in range(raw["prompt_len"])]
        self.max_new_tokens = raw["max_new_tokens"]
        self.arrival_step = raw.get("arrival_step", 0) or 0
        self.eos_after = raw.get("eos_after")  # None = not set
        self.accept_script = raw.get("accept_script")  # None = absent
        # §2 state
        self.state = "WAITING"
        self.finish_reason = None
        self.generated = 0
        self.computed = 0
        self.page_table = []
        self.draft_len = 0
        # phase 6: how many decode items of this request were committed
        self.committed_decode_items = 0
        # phase 3 result for this step
        self.decoding = False

    @property
    def prompt(self):
        return len(self.tokens)

    @property
    def target(self):
        return self.prompt + self.generated

    @property
    def remaining(self):
        return self.target - self.computed + self.draft_len


class Page:
    def __init__(self, page_id, page_size):
        self.page_id = page_id
        self.owner = NOBODY
        self.slots = [None] * page_size  # None = empty, else (request_id, pos)


class CacheNode:
    def __init__(self, key, page_id, parent):
        self.key = key
        self.page_id = page_id
        self.parent = parent
        self.children = {}  # key -> CacheNode, insertion order (dict order)


class NaiveEngine:
    def __init__(self, workload):
        engine = dict(ENGINE_DEFAULTS)
        engine.update(workload.get("engine") or {})
        self.max_step_tokens = engine["max_step_tokens"]
        self.page_size = engine["page_size"]
        self.num_pages = engine["num_pages"]
        self.spec_len = engine["spec_len"]
        self.requests = [Request(i, r) for i, r in enumerate(workload.get("requests") or [])]
        # §2: pool of num_pages pages; free list starts ascending.
        self.pages = [Page(i, self.page_size) for i in range(self.num_pages)]
        self.free_list = list(range(self.num_pages))
        # §2: radix cache; ROOT is a node with no page.
        self.root = CacheNode(ROOT, None, None)

    # ---------------------------------------------------------------- pool
    def take_page(self, owner):
        # §2: "a page is taken from its front"
        page_id = self.free_list.pop(0)
        self.pages[page_id].owner = owner
        return page_id

    def free_page(self, page_id):
        # §2: "Freeing a page sets its owner to nobody and empties its slots."
        # "a freed page goes to its back"
        page = self.pages[page_id]
        page.owner = NOBODY
        page.slots = [None] * self.page_size
        assert page_id not in self.free_list
        self.free_list.append(page_id)

    # ---------------------------------------------------------------- keys
    def prompt_keys(self, req, count=None):
        # §2: only complete prompt blocks have keys; key of block j is
        # (namespace, key of block j-1 or ROOT, the block's tokens).
        keys = []
        parent = ROOT
        nblocks = req.prompt // self.page_size
        if count is not None:
            nblocks = min(nblocks, count)
        for j in range(nblocks):
            block = tuple(req.tokens[j * self.page_size:(j + 1) * self.page_size])
            key = (NAMESPACE, parent, block)
            keys.append(key)
            parent = key
        return keys

    # ---------------------------------------------------------------- cache
    def match(self, keys):
        # §2: walk from ROOT along the keys, return page ids found, stop at
        # the first absent key.
        found = []
        node = self.root
        for key in keys:
            if key not in node.children:
                break
            node = node.children[key]
            found.append(node.page_id)
        return found

    def insert(self, keys, pages):
        # §2: walk the same way, creating missing nodes.
        node = self.root
        for key, page_id in zip(keys, pages):
            if key not in node.children:
                node.children[key] = CacheNode(key, page_id, node)
            node = node.children[key]

    def tree_order(self):
        # §2: depth-first, each node before its children, children in
        # insertion order.  ROOT itself is not a cache node.
        out = []

        def visit(node):
            for child in node.children.values():
                out.append(child)
                visit(child)

        visit(self.root)
        return out

    def page_in_unfinished_table(self, page_id):
        for r in self.requests:
            if r.state != "FINISHED" and page_id in r.page_table:
                return True
        return False

    def evict_one(self):
        # §3.5: "remove the first cache leaf in tree order whose page no
        # unfinished request has in its page table, and free that page."
        for node in self.tree_order():
            if node.children:
                continue  # not a leaf
            if self.page_in_unfinished_table(node.page_id):
                continue
            del node.parent.children[node.key]
            self.free_page(node.page_id)
            return node.page_id
        return None

    def free_owned_pages(self, req):
        # "Free the pages it owns (in page table order)"; cache-owned pages stay.
        for page_id in req.page_table:
            if self.pages[page_id].owner == req.request_id:
                self.free_page(page_id)
        req.page_table = []

    # ---------------------------------------------------------------- run
    def run(self):
        lines = []
        step = 0
        while any(r.state != "FINISHED" for r in self.requests):
            try:
                lines.append(self.one_step(step))
            except EngineFailure as failure:
                lines.append({"error": failure.kind, "message": failure.message, "step": step})
                return lines
            step += 1
        lines.append({"summary": [
            {
                "request_id": r.request_id,
                "state": r.state,
                "generated": r.generated,
                "computed": r.computed,
                "finish_reason": r.finish_reason,
            }
            for r in self.requests
        ]})
        return lines

    def one_step(self, step):
        admitted = []
        scheduled = []
        executed = {}
        sampled = {}
        finished = {}
        preempted = []
        reused = {}
        published = {}
        evicted = []
        drafted_tr = {}
        accepted_tr = {}
        rolled_back_tr = {}
        ps = self.page_size

        # ---- Phase 1, admit: "every WAITING request with arrival_step <=
        # step, in request list order, becomes RUNNING."
        for r in self.requests:
            if r.state == "WAITING" and r.arrival_step <= step:
                r.state = "RUNNING"
                admitted.append(r.request_id)

        # ---- Phase 2, reuse: "every RUNNING request with computed == 0 and
        # an empty page table matches its prompt keys in the cache."
        for r in self.requests:
            if r.state == "RUNNING" and r.computed == 0 and r.page_table == []:
                hits = self.match(self.prompt_keys(r))
                usable = min(len(hits), (r.prompt - 1) // ps)
                if usable > 0:
                    # page table = first `usable` hit pages (still cache-owned)
                    r.page_table = list(hits[:usable])
                    r.computed = usable * ps
                    reused[r.request_id] = r.computed

        # ---- Phase 3, draft: decoding when generated >= 1 and
        # computed == target - 1.
        for r in self.requests:
            if r.state != "RUNNING":
                continue
            if r.generated >= 1 and r.computed == r.target - 1:
                r.decoding = True
                r.draft_len = min(self.spec_len, r.max_new_tokens - r.generated - 1)
            else:
                r.decoding = False
                r.draft_len = 0

        # ---- Phase 4, schedule: fresh budget; in list order each RUNNING
        # request takes min(remaining, budget) if > 0; stop once budget is 0.
        budget = self.max_step_tokens
        work = []  # list of [request, n]
        for r in self.requests:
            if budget == 0:
                break
            if r.state != "RUNNING":
                continue
            n = min(r.remaining, budget)
            if n > 0:
                work.append([r, n])
                scheduled.append(r.request_id)
                budget -= n

        # ---- Phase 5, residency.
        if work:
            anchor = work[0][0]
            anchor_n = work[0][1]
            if pages_needed(anchor.computed + anchor_n, ps) > self.num_pages:
                raise EngineFailure(
                    "Irreducible", "%s alone outgrows the pool" % anchor.request_id)
            while True:
                shortfall = 0
                for r, n in work:
                    shortfall += max(0, pages_needed(r.computed + n, ps) - len(r.page_table))
                if shortfall <= len(self.free_list):
                    # "extend each page table in work order from the free list"
                    for r, n in work:
                        while len(r.page_table) < pages_needed(r.computed + n, ps):
                            r.page_table.append(self.take_page(r.request_id))
                    break
                # Evict: "while fewer pages were evicted this pass than the
                # shortfall minus the free pages, remove the first cache leaf..."
                evicted_this_pass = 0
                goal = shortfall - len(self.free_list)
                while evicted_this_pass < goal:
                    page_id = self.evict_one()
                    if page_id is None:
                        break
                    evicted.append(page_id)
                    evicted_this_pass += 1
                    # goal was computed before this pass's evictions
                if evicted_this_pass > 0:
                    continue  # "If anything was evicted, retry."
                # Preempt: "the last request in request list order that is
                # RUNNING, is not the anchor, and has a non-empty page table
                # or is still in this step's work."
                in_work = [w[0] for w in work]
                victim = None
                for r in self.requests:
                    if r.state != "RUNNING" or r is anchor:
                        continue
                    if r.page_table or r in in_work:
                        victim = r
                if victim is None:
                    raise EngineFailure("OutOfPages", "no page and no preemption victim")
                self.free_owned_pages(victim)
                victim.computed = 0  # stays RUNNING, keeps generated
                work = [w for w in work if w[0] is not victim]
                preempted.append(victim.request_id)

        # ---- Phase 6, plan: one item per remaining work entry.
        plan = []
        for r, n in work:
            placements = []
            for pos in range(r.computed, r.computed + n):
                placements.append((pos, r.page_table[pos // ps], pos % ps))
            plan.append({
                "request_id": r.request_id,
                "start_position": r.computed,
                "num_tokens": n,
                "draft_len": r.draft_len,
                "decode": r.decoding,
                "verdict_index": r.committed_decode_items,
                "placements": placements,
            })

        # ---- Phase 7, execute (every rank identical; bookkeeping only).
        result = []
        for item in plan:
            if item["decode"]:
                drafted = item["num_tokens"] - 1
                req = self.by_id(item["request_id"])
                script = req.accept_script
                if script is not None and item["verdict_index"] < len(script):
                    accepted = max(0, min(script[item["verdict_index"]], drafted))
                else:
                    accepted = drafted
            else:
                accepted = 0
            result.append({
                "request_id": item["request_id"],
                "start_position": item["start_position"],
                "executed_tokens": item["num_tokens"],
                "accepted": accepted,
                "writes": list(item["placements"]),
            })

        # ---- Phase 8, join: all ranks agree (world_size ignored).
        # ---- Phase 9, apply: validation trivially passes; writes land in
        # the pool and computed += executed_tokens.
        for item, outcome in zip(plan, result):
            req = self.by_id(outcome["request_id"])
            for pos, page_id, offset in outcome["writes"]:
                self.pages[page_id].slots[offset] = (req.request_id, pos)
            req.computed += outcome["executed_tokens"]
            executed[req.request_id] = outcome["executed_tokens"]

        # ---- Phase 10, resolve, for each decode item.
        for item, outcome in zip(plan, result):
            if not item["decode"]:
                continue
            req = self.by_id(item["request_id"])
            drafted = item["num_tokens"] - 1
            accepted = outcome["accepted"]
            if req.eos_after is not None:
                accepted = min(accepted, req.eos_after - req.generated)
            rolled_back = drafted - accepted
            req.computed -= rolled_back
            req.generated += accepted
            while len(req.page_table) > pages_needed(req.computed, ps):
                page_id = req.page_table.pop()
                if self.pages[page_id].owner == req.request_id:
                    self.free_page(page_id)
            req.draft_len = 0
            req.committed_decode_items += 1
            drafted_tr[req.request_id] = drafted
            accepted_tr[req.request_id] = accepted
            rolled_back_tr[req.request_id] = rolled_back

        # ---- Phase 11, publish, for each work entry in order.
        for r, n in work:
            complete = min(r.computed, r.prompt) // ps
            keys = self.prompt_keys(r, complete)
            resident_pages = self.match(keys)
            resident = len(resident_pages)
            if resident < complete:
                own = r.page_table[resident:complete]
                self.insert(keys, resident_pages + own)
                for page_id in own:
                    self.pages[page_id].owner = CACHE
                published[r.request_id] = complete - resident

        # ---- Phase 12, sample, entries whose computed == target.
        to_update = []
        for r, n in work:
            if r.computed == r.target:
                if r.eos_after is not None and r.generated >= r.eos_after:
                    verdict = "EOS"
                else:
                    verdict = "TOKEN"
                sampled[r.request_id] = verdict
                to_update.append((r, verdict))

        # ---- Phase 13, update, same entries.
        for r, verdict in to_update:
            if verdict == "EOS":
                r.state = "FINISHED"
                r.finish_reason = "EOS"
            else:
                r.generated += 1
                if r.generated >= r.max_new_tokens:
                    r.state = "FINISHED"
                    r.finish_reason = "LENGTH"
            if r.state == "FINISHED":
                self.free_owned_pages(r)
                finished[r.request_id] = r.finish_reason

        # §4 trace line, fields in this exact order.
        return {
            "step": step,
            "admitted": admitted,
            "scheduled": scheduled,
            "executed": executed,
            "sampled": sampled,
            "finished": finished,
            "preempted": preempted,
            "reused": reused,
            "published": published,
            "evicted": evicted,
            "drafted": drafted_tr,
            "accepted": accepted_tr,
            "rolled_back": rolled_back_tr,
        }

    def by_id(self, request_id):
        for r in self.requests:
            if r.request_id == request_id:
                return r
        raise KeyError(request_id)


def naive_run(workload):
    return NaiveEngine(workload).run()


def main(argv):
    if len(argv) != 2:
        print("usage: naive_reference.py SPEC.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        workload = json.load(f)
    lines = naive_run(workload)
    for line in lines:
        print(json.dumps(line))
    return 1 if lines and "error" in lines[-1] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
