"""A run's state as its wire log tells it, record by record: what the live page, /metrics,
/health and /status show.

`LiveState.add(records)` takes the records a follower read (in the log's order) and keeps:

- the page's model (page/model.Builder), fed the same records as `html` feeds it,
  so the live page is the page of the log so far;
- the numbers /metrics serves (`Numbers`): the last step's counters, totals, per-rank
  counts and histograms (among them, from each joined attempt's arrivals, how long each
  rank's result waited for the last and how often a rank was the last), the requests'
  first-token and inter-token times;
- where the run is (`health`, `status`): starting, stepping, recovering (between a loss and
  the replacement's first committed step), ended or failed, with the reason.

Everything here is read from the records alone (nothing from the scheduler's memory), so
the same state follows a run of `launch --serve`, a library run's log, or a log written
long ago. Whatever a record holds, `add` never raises: what cannot be used is skipped (the
page's model counts it). Memory: bounded as the page's model is, plus one entry per request
in flight (dropped when it finishes) within REQUEST_BUDGET bytes, its id's and its entry's
(a request admitted past it is counted, `requests_not_kept`, and said on the page and by
/status: its token times are not measured), and a few numbers per rank (ranks beyond MAX_RANKS
are not counted per rank).
"""
from __future__ import annotations

import bisect
import math
import threading
import time
from typing import Any, Iterable

from inferris_dist.engine.rungs import rung as rung_named
from inferris_dist.page.data import page_data
from inferris_dist.page.model import Builder, error_text, is_int, is_num, say
from inferris_dist.protocol import wire
from inferris_dist.protocol.wire import MsgType

MAX_RANKS = 256              # ranks counted one by one (labels of /metrics); more are not
MAX_WORLD = 4096             # arrivals at one join at most (a rank is below 4096): more, none counted
REQUEST_BUDGET = 16 << 20    # bytes of the requests in flight whose token times are kept
REQUEST_COST = 256           # what one kept request costs beside its id's characters (its entry)
MAX_REASONS = 32             # finish and loss reasons kept as labels (the rest: "other")
URGENT = frozenset({"rank-lost", "restart", "resize", "rejoin-wait", "step-failed", "audit-failed",
                    "end", "member", "run"})   # worth showing at once, not at the next tick
NO_END_NOTE = "the log has no end record"   # the page's note for a log whose run goes on

# Histogram bounds, seconds and steps.
RTT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
               2.5, 5.0, 10.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                30.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
               1.0, 2.5, 5.0, 10.0)
STEPS_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024, 4096)


class Histogram:
    """Counts in fixed buckets (each bucket counts the values <= its bound), a sum, a count."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple):
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        if not math.isfinite(v):
            return
        i = bisect.bisect_left(self.bounds, v)
        if i < len(self.counts):
            self.counts[i] += 1
        self.sum += v
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, values <= le)], "+Inf" last, as the exposition format gives them."""
        out, total = [], 0
        for bound, n in zip(self.bounds, self.counts):
            total += n
            out.append((_le(bound), total))
        out.append(("+Inf", self.count))
        return out


def _le(bound: float) -> str:
    return repr(float(bound))


class RankNumbers:
    __slots__ = ("rtt", "sent", "received", "dropped", "dropped_at_end", "restarts", "losses", "join_wait",
                 "last_arrivals")

    def __init__(self):
        self.rtt = Histogram(RTT_BUCKETS)
        self.join_wait = Histogram(RTT_BUCKETS)   # per joined attempt: its result's wait for the last
        self.last_arrivals = 0                    # joined attempts whose join waited for this rank
        self.sent = 0                 # bytes, header and body, as the rank table counts them
        self.received = 0
        self.dropped = 0              # replies dropped that the log records one by one
        self.dropped_at_end = 0       # the run's own count, from its last records
        self.restarts = 0
        self.losses: dict[str, int] = {}


class Numbers:
    """What /metrics serves: a serving engine's numbers, from the records."""

    def __init__(self):
        self.counters: dict[str, int] = {}         # the last step's (as --metrics counts them)
        self.num_pages = 0
        self.reuse = True                          # the rung looks prompts up in the prefix cache
        self.prompt_tokens = 0
        self.prefix_queried = 0
        self.prefix_hits = 0
        self.generation_tokens = 0
        self.drafted = 0
        self.accepted = 0
        self.preemptions = 0
        self.finished: dict[str, int] = {}
        self.steps = 0                              # committed, idle stretches included
        self.attempts = 0
        self.attempts_failed = 0
        self.epoch = 0
        self.world_requested = 0                    # the run's world size (the `run` record's)
        self.world_effective = 0                    # the world's size now (its last resize's)
        self.ranks: dict[int, RankNumbers] = {}
        self.step_seconds = Histogram(STEP_BUCKETS)
        self.ttft_seconds = Histogram(TTFT_BUCKETS)
        self.ttft_steps = Histogram(STEPS_BUCKETS)
        self.itl_seconds = Histogram(ITL_BUCKETS)
        self.itl_steps = Histogram(STEPS_BUCKETS)

    def rank(self, r: Any) -> RankNumbers | None:
        if not is_int(r) or not 0 <= r < 1 << 20:
            return None
        n = self.ranks.get(r)
        if n is None and len(self.ranks) < MAX_RANKS:
            n = self.ranks[r] = RankNumbers()
        return n


def _count(d: dict[str, int], key: Any, n: int = 1) -> None:
    key = say(key)[:40] if key is not None else "unknown"
    if key not in d and len(d) >= MAX_REASONS:
        key = "other"
    d[key] = d.get(key, 0) + n


class LiveState:
    """The run as its records say, for the live server; every method is thread-safe (one lock)."""

    def __init__(self, title: str | None = None):
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)   # notified when `version` moves
        self.title = title
        self.builder = Builder()
        self.numbers = Numbers()
        self.version = 0              # records taken (each add that took any moves it)
        self.urgent = False           # a record worth showing at once came since the last take
        self.run: dict | None = None
        self.end: dict | None = None
        self.health = "starting"      # starting, stepping, recovering, ended, failed
        self.reason = "no step has committed yet"
        self.recover_from: int | None = None    # the epoch a step must commit in to be recovered
        self.last_step: int | None = None
        self.last_t: float | None = None        # the scheduler's clock at the last record
        self.members: dict[int, dict] = {}
        self.restarts = 0
        self.losses = 0
        self.follow_error: str | None = None    # the follower stopped: why
        self._phase_start: dict[int, float] = {}   # step -> its first phase's start (steps in flight)
        self._requests: dict[str, list] = {}       # request -> [admitted step, its start t, last step, t]
        self._request_bytes = 0                     # what _requests costs, within REQUEST_BUDGET
        self.requests_not_kept = 0                  # admitted past the budget: no token times
        self._world = 0

    # -- taking records ----------------------------------------------------------------------

    def add(self, records: Iterable[dict]) -> None:
        with self.lock:
            took = False
            for obj in records:
                took = True
                self.builder.add(obj)
                try:
                    self._take(obj)
                except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
                    pass                 # a malformed record: the page's model counted it
            if took:
                self.version += 1
                self.changed.notify_all()

    def stopped(self, why: str) -> None:
        """The follower cannot go on (the log was cut or replaced): said by /health and /status."""
        with self.lock:
            self.follow_error = why
            self.version += 1
            self.urgent = True
            self.changed.notify_all()

    def _take(self, obj: dict) -> None:
        t = obj.get("t")
        if is_num(t):
            self.last_t = float(t)
        event = obj.get("event")
        if event is None:
            self._message(obj)
            return
        if event in URGENT:
            self.urgent = True
        handler = _EVENTS.get(event)
        if handler is not None:
            handler(self, obj)

    def _message(self, m: dict) -> None:
        n = self.numbers
        kind, size = m.get("type"), m.get("bytes")
        if m.get("link") is not None or not isinstance(kind, str) or not is_int(size):
            return
        rank = n.rank(m.get("rank"))
        if rank is None:
            return
        if m.get("dir") == "out":
            rank.sent += size + self._header_size(kind, m)
            return
        dropped = m.get("dropped")
        if kind in ("HELLO", "READY") or dropped in ("stale", "duplicate", "future"):
            if dropped is not None:
                rank.dropped += 1
            return
        if isinstance(m.get("body"), dict) and "undecodable" in m["body"] and "sent" not in m:
            return                       # a message that did not decode where a reply was awaited
        rank.received += size + self._header_size(kind, m)
        if dropped == "void":
            rank.dropped += 1
        rtt = m.get("rtt")
        if kind == "RESULT" and is_num(rtt):
            rank.rtt.observe(float(rtt))

    def _header_size(self, kind: str, m: dict) -> int:
        """The header's bytes: not in the log, but a function of what is (type, epoch, step,
        rank, world size)."""
        try:
            return len(wire.encode_header(MsgType[kind], m["epoch"], m["step"], m["rank"], self._world))
        except (KeyError, TypeError, ValueError, OverflowError):
            return 0

    # -- events

    def _ev_run(self, ev: dict) -> None:
        self.run = ev
        config = ev.get("config") if isinstance(ev.get("config"), dict) else {}
        pages = config.get("num_pages")
        self.numbers.num_pages = pages if is_int(pages) and pages > 0 else 0
        world = ev.get("world_size")
        self._world = world if is_int(world) and 0 < world < 1 << 16 else 0
        self.numbers.world_requested = self.numbers.world_effective = self._world
        try:
            self.numbers.reuse = rung_named(ev.get("rung")).reuse
        except Exception:
            self.numbers.reuse = True

    def _ev_member(self, ev: dict) -> None:
        rank = ev.get("rank")
        if is_int(rank) and (rank in self.members or len(self.members) < MAX_RANKS):
            self.members[rank] = {"rank": rank, "epoch": ev.get("epoch") if is_int(ev.get("epoch")) else None,
                                  "pid": ev.get("pid") if is_int(ev.get("pid")) else None,
                                  "host": say(ev.get("host"))[:200] if ev.get("host") else ""}
        self._epoch(ev.get("epoch"))

    def _epoch(self, e: Any) -> None:
        if is_int(e) and e > self.numbers.epoch:
            self.numbers.epoch = e

    def _ev_phase(self, ev: dict) -> None:
        step, t = ev.get("step"), ev.get("t")
        if is_int(step) and is_num(t) and step not in self._phase_start:
            if len(self._phase_start) > 64:          # a step that never committed: forget the oldest
                self._phase_start.pop(min(self._phase_start))
            self._phase_start[step] = float(t)

    def _ev_attempt(self, ev: dict) -> None:
        n = self.numbers
        n.attempts += 1
        verdict = ev.get("verdict")
        if verdict != "joined" and not (isinstance(verdict, str) and verdict.startswith("void")):
            n.attempts_failed += 1
        if verdict == "joined" and isinstance(ev.get("arrivals"), list):
            self._arrivals(ev["arrivals"])

    def _arrivals(self, arrivals: list) -> None:
        """A joined attempt's arrivals: each rank's result waited for the last one (the most
        behind the first; max behind - its behind), and the last one is counted (a world of one
        has none). Arrivals that are not each rank once with a finite behind >= 0: none counted."""
        if not arrivals or len(arrivals) > MAX_WORLD:
            return
        behind: dict[int, float] = {}
        for x in arrivals:
            rank = x.get("rank") if isinstance(x, dict) else None
            b = x.get("behind") if isinstance(x, dict) else None
            if not (is_int(rank) and is_num(b) and b >= 0) or rank in behind:
                return
            behind[rank] = float(b)
        most = max(behind.values())
        for rank, b in behind.items():
            numbers = self.numbers.rank(rank)
            if numbers is not None:
                numbers.join_wait.observe(most - b)
        if len(behind) > 1:
            last = max(behind, key=behind.__getitem__)      # the first of equals, in the log's order
            numbers = self.numbers.rank(last)
            if numbers is not None:
                numbers.last_arrivals += 1

    def _ev_step(self, ev: dict) -> None:
        n = self.numbers
        step, t = ev.get("step"), ev.get("t")
        if not is_int(step) or not is_num(t):
            return
        t = float(t)
        n.steps += 1
        self.last_step = step
        self._epoch(ev.get("epoch"))
        counters = ev.get("counters")
        if isinstance(counters, dict):
            n.counters = {k: v for k, v in counters.items() if isinstance(k, str) and is_int(v)}
        trace = ev.get("trace") if isinstance(ev.get("trace"), dict) else {}
        prompt = ev.get("prompt_tokens")
        if is_int(prompt) and prompt >= 0:
            n.prompt_tokens += prompt
            if n.reuse:
                n.prefix_queried += prompt
        c = n.counters
        n.prefix_hits += c.get("prefix_hit_tokens", 0)
        n.drafted += c.get("drafted_tokens", 0)
        n.accepted += c.get("accepted_tokens", 0)
        n.preemptions += c.get("requests_preempted", 0)
        started = self._phase_start.pop(step, None)
        for s in [s for s in self._phase_start if s < step]:
            del self._phase_start[s]
        begun = started if started is not None else t
        if started is not None:
            n.step_seconds.observe(max(0.0, t - started))
        self._tokens(step, t, begun, trace)
        if self.health == "starting" or (self.health == "recovering" and self.recover_from is not None
                                         and is_int(ev.get("epoch")) and ev["epoch"] >= self.recover_from):
            self.health, self.reason, self.recover_from = "stepping", "", None

    def _tokens(self, step: int, t: float, begun: float, trace: dict) -> None:
        """Tokens generated in the step, and each request's first-token and inter-token times."""
        n = self.numbers
        requests = self._requests
        admitted = trace.get("admitted") if isinstance(trace.get("admitted"), list) else []
        for rid in admitted:
            if not isinstance(rid, str) or rid in requests:
                continue
            if self._request_bytes + len(rid) + REQUEST_COST > REQUEST_BUDGET:
                self.requests_not_kept += 1
                continue
            requests[rid] = [step, begun, None, None]
            self._request_bytes += len(rid) + REQUEST_COST
        sampled = trace.get("sampled") if isinstance(trace.get("sampled"), dict) else {}
        accepted = trace.get("accepted") if isinstance(trace.get("accepted"), dict) else {}
        n.generation_tokens += sum(v for v in accepted.values() if is_int(v) and v > 0)
        for rid, kind in sampled.items():
            if kind == "TOKEN":
                n.generation_tokens += 1
            r = requests.get(rid)
            if r is None:
                continue
            if r[2] is None:
                n.ttft_steps.observe(step - r[0])
                n.ttft_seconds.observe(max(0.0, t - r[1]))
            else:
                n.itl_steps.observe(step - r[2])
                n.itl_seconds.observe(max(0.0, t - r[3]))
            r[2], r[3] = step, t
        finished = trace.get("finished") if isinstance(trace.get("finished"), dict) else {}
        for rid, why in finished.items():
            _count(n.finished, why)
            if requests.pop(rid, None) is not None:
                self._request_bytes -= len(rid) + REQUEST_COST

    def _ev_idle(self, ev: dict) -> None:
        first, last = ev.get("first"), ev.get("last")
        if is_int(first) and is_int(last) and last >= first:
            self.numbers.steps += last - first + 1
            self.last_step = max(self.last_step or 0, last)

    def _ev_rank_lost(self, ev: dict) -> None:
        n = self.numbers
        self.losses += 1
        ranks = ev.get("ranks") if isinstance(ev.get("ranks"), list) else []
        if not ranks and ev.get("rank") is None:
            ranks = list(n.ranks)
        for r in ranks:
            numbers = n.rank(r)
            if numbers is not None:
                _count(numbers.losses, ev.get("reason"))
        self._recovering(ev, f"{_ranks(ranks)} lost at step {ev.get('step')} "
                             f"({say(ev.get('reason'))[:40]}): {say(ev.get('message'))[:300]}")

    def _ev_step_failed(self, ev: dict) -> None:
        self._recovering(ev, f"step {ev.get('step')} failed ({say(ev.get('kind'))[:60]}): "
                             f"{say(ev.get('message'))[:300]}")

    def _ev_audit_failed(self, ev: dict) -> None:
        self._recovering(ev, f"rank {ev.get('rank')} failed the audit after step {ev.get('step')}: "
                             f"{say(ev.get('message'))[:300]}")

    def _recovering(self, ev: dict, why: str) -> None:
        if self.health in ("ended", "failed"):
            return
        epoch = ev.get("epoch")
        self.health, self.reason = "recovering", why
        self.recover_from = (epoch + 1) if is_int(epoch) else self.numbers.epoch + 1

    def _ev_restart(self, ev: dict) -> None:
        self.restarts += 1
        ranks = ev.get("ranks") if isinstance(ev.get("ranks"), list) else []
        for r in ranks:
            numbers = self.numbers.rank(r)
            if numbers is not None:
                numbers.restarts += 1
        epoch = ev.get("epoch")
        self._epoch(epoch)
        if self.health in ("ended", "failed"):
            return
        self.health = "recovering"
        self.reason = (f"{say(ev.get('policy'))[:40]}: restarting {_ranks(ranks)} into epoch {epoch} "
                       f"at step {ev.get('step')}")
        if is_int(epoch):
            self.recover_from = epoch

    def _ev_resize(self, ev: dict) -> None:
        """The world changed size: its size now (and the headers' world size from here on), the
        members kept at their new ranks, the new epoch; a shrink is said as the recovery's reason."""
        new, old, kept = ev.get("to"), ev.get("from"), ev.get("kept")
        if not is_int(new) or not 0 < new < 1 << 16:
            return
        self.numbers.world_effective = self._world = new
        epoch = ev.get("epoch")
        self._epoch(epoch)
        if isinstance(kept, list):
            members = {}
            for rank, was in enumerate(kept[:MAX_RANKS]):
                if is_int(was) and was in self.members:
                    members[rank] = dict(self.members[was], rank=rank)
            self.members = members
        if self.health == "recovering":
            step = ev.get("step")
            self.reason = (f"{say(ev.get('why'))[:40]}: world size {old if is_int(old) else '?'} -> {new}"
                           f"{f' in epoch {epoch}' if is_int(epoch) else ''}"
                           f"{f' from step {step}' if is_int(step) else ''}")
            if is_int(epoch):
                self.recover_from = epoch

    def _ev_rejoin_wait(self, ev: dict) -> None:
        if self.health == "recovering" and ev.get("joined") is not True:
            ranks = ev.get("ranks") if isinstance(ev.get("ranks"), list) else []
            self.reason = f"no replacement joined for {_ranks(ranks)}"

    def _ev_turned_away(self, ev: dict) -> None:
        drops = ev.get("member_replies_dropped")
        if isinstance(drops, dict):
            for r, count in drops.items():
                numbers = self.numbers.rank(int(r)) if isinstance(r, str) and r.isdigit() else None
                if numbers is not None and is_int(count):
                    numbers.dropped_at_end = count

    def _ev_end(self, ev: dict) -> None:
        self.end = ev
        if ev.get("status") == "ok":
            self.health, self.reason = "ended", ""
        else:
            error = ev.get("error")
            self.health = "failed"
            self.reason = error_text(error)[:400] if error is not None else "the run failed"

    # -- reading -----------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self.end is not None

    def take_urgent(self) -> bool:
        """Whether something worth showing at once came since the last call (lock held)."""
        urgent, self.urgent = self.urgent, False
        return urgent

    def health_json(self) -> tuple[bool, dict]:
        """(healthy, what /health says): healthy while starting, stepping or ended well."""
        with self.lock:
            health, reason = self.health, self.reason
            if self.follow_error is not None and health not in ("ended", "failed"):
                health, reason = "unknown", f"the log is no longer followed: {self.follow_error}"
            body = {"health": health, "reason": reason, "step": self.last_step,
                    "epoch": self.numbers.epoch}
        return health in ("starting", "stepping", "ended"), body

    def status_json(self) -> dict:
        with self.lock:
            return self._status()

    def _status(self) -> dict:
        run = self.run or {}
        n = self.numbers
        end = self.end
        return {
            "name": say(run.get("name"))[:200] if run.get("name") is not None else None,
            "world_size": run.get("world_size") if is_int(run.get("world_size")) else None,
            "rung": say(run.get("rung"))[:40] if run.get("rung") is not None else None,
            "policy": say(run.get("policy"))[:40] if run.get("policy") is not None else None,
            "faults": [say(f)[:80] for f in run.get("faults", [])[:32]]
            if isinstance(run.get("faults"), list) else [],
            "requests": run.get("requests") if is_int(run.get("requests")) else None,
            "step": self.last_step,
            "steps": n.steps,
            "epoch": n.epoch,
            "members": [self.members[r] for r in sorted(self.members)],
            "restarts": {"spent": self.restarts,
                         "allowed": run.get("max_restarts") if is_int(run.get("max_restarts")) else None},
            "losses": self.losses,
            "health": self.health if self.follow_error is None or end else "unknown",
            "reason": self.reason if self.follow_error is None or end else self.follow_error,
            "requests_finished": sum(n.finished.values()),
            "requests_not_kept": self.requests_not_kept,
            "ended": end is not None,
            "status": say(end.get("status"))[:20] if end is not None else None,
            "error": error_text(end["error"])[:400] if end is not None and end.get("error") else None,
            # the size the run asked for (world_size above), and the size it has now
            "world": {"requested": n.world_requested or None, "effective": n.world_effective or None},
        }

    def page_data(self) -> dict:
        """The page's data of the records so far (lock held): the model left as it was."""
        b = self.builder
        # page_data marks replacements on the model: its marks and their counts are put back
        kept, dropped = len(b.marks), b.dropped_marks
        marks_of, dropped_of = dict(b.marks_of), dict(b.dropped_of)
        try:
            run_name = b.run.get("name") if b.run and isinstance(b.run.get("name"), str) else ""
            title = self.title if self.title else f"inferris-dist · {run_name or 'wire log'}"
            data = page_data(b, title, [])
        finally:
            del b.marks[kept:]
            b.dropped_marks = dropped
            b.marks_of, b.dropped_of = marks_of, dropped_of
        if self.end is None:      # the run goes on: its log has no end yet, and that is no fault
            data["notes"] = [n for n in data["notes"] if not n.startswith(NO_END_NOTE)]
        if self.requests_not_kept:
            data["notes"].append(f"{self.requests_not_kept:,} requests not kept: admitted while the "
                                 f"server's budget for requests in flight ({REQUEST_BUDGET >> 20} MB) was "
                                 f"spent, their token times are not in /metrics")
        return data

    def live_json(self) -> dict:
        """What the live page says above the page (lock held)."""
        status = self._status()
        return {"version": self.version, "health": status["health"], "reason": status["reason"],
                "step": self.last_step, "steps": status["steps"], "epoch": status["epoch"],
                "ended": status["ended"], "status": status["status"], "error": status["error"],
                "restarts": self.restarts, "losses": self.losses, "world": status["world"],
                "at": time.time()}


def _ranks(ranks: list) -> str:
    ranks = [r for r in ranks if is_int(r)][:16]
    if not ranks:
        return "every rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


_EVENTS = {name: getattr(LiveState, "_ev_" + name.replace("-", "_"))
           for name in ("run", "member", "phase", "attempt", "step", "idle", "rank-lost", "step-failed",
                        "audit-failed", "restart", "resize", "rejoin-wait", "turned-away", "end")}
