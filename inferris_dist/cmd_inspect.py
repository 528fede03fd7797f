"""`inferris-dist inspect WIRELOG [--step K]`: a wire log read back, step by step.

A wire log (`launch --wire-log`) holds one JSON line per message that crossed the boundary
and one per event (a rank lost, a restart, a note). Without --step: one line per attempt at
a step (step, epoch, plan items and bytes, result bytes, verdict), the events where they
happened, and the totals. With --step K: each attempt's plan item by item, every rank's
result and the join. The file is streamed: the summary keeps one small record per attempt,
--step only that step's lines, so a long run costs memory per step, not per message.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator, TextIO

from engine import WorkloadError

from .cliargs import EXIT_OK
from .render import STEP_WIDTH, Style, human_bytes, shown

PAD = " " * (STEP_WIDTH + 2)     # event lines sit under the figures, as in launch's output


def run_inspect(path: str, step: int | None, out: TextIO, style: Style) -> int:
    lines = _summary(path, style) if step is None else _one_step(path, step, style)
    out.write("".join(line + "\n" for line in lines))     # all read before a word is printed
    return EXIT_OK


# -- reading: one line naming the file for anything that is not a wire log ---------------

def _is_int(v: Any) -> bool:
    return type(v) is int                    # JSON gives no int subclass but bool: refuse it


def _is_message(obj: dict) -> bool:
    return (obj.get("dir") in ("in", "out") and isinstance(obj.get("type"), str)
            and all(_is_int(obj.get(k)) for k in ("epoch", "step", "bytes"))
            and (obj.get("rank") is None or _is_int(obj.get("rank"))))


def _records(path: str) -> Iterator[dict]:
    name = shown(path)
    try:
        # A valid log is ASCII (json.dumps escapes the rest); a stray byte must not be a traceback.
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except (ValueError, RecursionError):
                    raise WorkloadError(f"{name} line {n}: not JSON") from None
                if not isinstance(obj, dict) or not (isinstance(obj.get("event"), str) or _is_message(obj)):
                    raise WorkloadError(f"{name} line {n}: neither a wire message nor an event")
                if obj.get("type") in ("PLAN", "RESULT") and "event" not in obj and not _body_ok(obj):
                    raise WorkloadError(f"{name} line {n}: malformed {obj['type']} body")
                yield obj
    except OSError as e:
        raise WorkloadError(f"inspect {name}: {e.strerror or e}") from None


def _body_ok(msg: dict) -> bool:
    body = msg.get("body")
    if msg["type"] == "PLAN":
        body = body.get("items") if isinstance(body, dict) else None
    return isinstance(body, list) and all(isinstance(x, dict) for x in body)


def _txt(v: Any) -> str:
    """Any value from the log as safe text: strings escaped, page lists joined."""
    if isinstance(v, str):
        return shown(v)
    if isinstance(v, list) and all(_is_int(x) for x in v):
        return ",".join(map(str, v)) or "-"
    return shown(json.dumps(v))


def _ranks(ranks: Any) -> str:
    if not isinstance(ranks, list) or not ranks:
        return f"ranks {_txt(ranks)}"
    if all(_is_int(r) for r in ranks) and len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(_txt, ranks))


def _event_line(ev: dict, style: Style) -> str:
    """One event, said once, in the words launch uses for it."""
    kind, g = ev["event"], ev.get
    where = f"step {_txt(g('step'))}, epoch {_txt(g('epoch'))}"
    if kind == "rank-lost":
        return PAD + style.red(f"! rank lost at {where}: {_txt(g('message'))}")
    if kind == "step-failed":
        return PAD + style.red(f"! {_txt(g('kind'))} at {where}: {_txt(g('message'))}")
    if kind == "audit-failed":
        return PAD + style.red(f"! audit failed after {where}: {_txt(g('message'))}")
    if kind == "restart":
        return PAD + style.yellow(f"restart: {_ranks(g('ranks'))} into epoch {_txt(g('epoch'))} at step "
                                  f"{_txt(g('step'))}, shard of {_txt(g('shard_pages'))} pages")
    if kind == "note":
        return PAD + style.yellow(f"! {_txt(g('text'))}")
    if kind == "idle":
        first, last = _txt(g("first")), _txt(g("last"))
        label = first if first == last else f"{first}-{last}"
        return f"{label:>{STEP_WIDTH}}  " + style.dim(f"idle: {_txt(g('text'))}")
    if kind == "turned-away":
        counts = [g(k) if isinstance(g(k), dict) else {} for k in ("messages", "connections")]
        sums = [sum(n for n in c.values() if _is_int(n)) for c in counts]
        return PAD + style.yellow(f"turned away: {sums[0]} message(s) from {len(counts[0])} peer(s) "
                                  f"holding no rank, {sums[1]} connection(s) refused")
    rest = ", ".join(f"{_txt(k)} {_txt(v)}" for k, v in ev.items() if k not in ("t", "event"))
    return PAD + style.yellow(f"{_txt(kind)}: {rest}")


def _key(obj: dict) -> tuple[int, int] | None:
    """(step, epoch) of a message or event, when both are there and are numbers."""
    s, e = obj.get("step"), obj.get("epoch")
    return (s, e) if _is_int(s) and _is_int(e) else None


def _lost(ev: dict) -> str:
    who = "every rank" if ev.get("rank") is None else _ranks(ev.get("ranks"))
    return f"{who} lost ({_txt(ev.get('reason'))})"


@dataclass
class Attempt:
    """One (step, epoch): the plan went out to some ranks; results came back or did not."""
    step: int
    epoch: int
    plan_bytes: int
    items: list | int                       # the items (--step), or just how many (summary)
    ranks: list[int] = field(default_factory=list)
    results: dict[int, tuple[int, list]] = field(default_factory=dict)   # rank -> (bytes, outcomes)
    failed: str = ""                        # a step-failed event's kind, a rank-lost verdict
    lost: str = ""
    lines: list[str] = field(default_factory=list)   # its events (--step)

    def verdict(self) -> str:
        # RESULTs are logged only once every rank answered and decoded; the join alone can fail then.
        if self.failed:
            return self.failed
        if self.ranks and all(r in self.results for r in self.ranks):
            return "joined"
        return self.lost or "no answer in the log"


class Reader:
    """The one pass over the log both views share; `keep` says which attempts keep detail."""

    def __init__(self, path: str, keep, style: Style):
        self.path, self.keep, self.style = path, keep, style
        self.attempts: dict[tuple[int, int], Attempt] = {}
        self.messages = self.sent = self.received = 0
        self.ranks: set[int] = set()
        self.idle: list[tuple[int, int, str]] = []        # (first, last, line)
        self.rows: list[Attempt | str] = []               # the summary, in the order things happened

    def read(self) -> None:
        current = None                                     # the attempt under way: notes are its
        for obj in _records(self.path):
            if "event" in obj:
                current = self._event(obj, current)
                continue
            self.messages += 1
            self.sent += obj["bytes"] if obj["dir"] == "out" else 0
            self.received += obj["bytes"] if obj["dir"] == "in" else 0
            if obj["rank"] is not None:
                self.ranks.add(obj["rank"])
            if obj["type"] == "PLAN":
                current = self._plan(obj)
            elif obj["type"] == "RESULT" and _key(obj) in self.attempts:
                a = self.attempts[_key(obj)]
                a.results[obj["rank"]] = (obj["bytes"], obj["body"] if self.keep(a.step) else [])
        if not self.messages:
            raise WorkloadError(f"{shown(self.path)}: no messages in the log")

    def _plan(self, msg: dict) -> Attempt:
        a = self.attempts.get(_key(msg))
        items = msg["body"]["items"]
        if a is None:
            a = Attempt(msg["step"], msg["epoch"], msg["bytes"],
                        items if self.keep(msg["step"]) else len(items))
            self.attempts[_key(msg)] = a
            self.rows.append(a)
        elif self.keep(a.step) and items != a.items:       # never by construction: say so if it was
            a.lines.append(PAD + self.style.red(f"! rank {msg['rank']} got a different plan"))
        a.ranks.append(msg["rank"])
        return a

    def _event(self, ev: dict, current: Attempt | None) -> Attempt | None:
        line = _event_line(ev, self.style)
        if ev["event"] == "idle":
            first, last = ev.get("first"), ev.get("last")
            if _is_int(first) and _is_int(last) and first <= last:
                self.idle.append((first, last, line))
        at = self.attempts.get(_key(ev)) if _key(ev) else current
        if ev["event"] == "step-failed" and at is not None:
            at.failed = _txt(ev.get("kind"))
        elif ev["event"] == "rank-lost" and at is not None:
            at.lost = _lost(ev)
        if at is not None and self.keep(at.step):
            at.lines.append(line)
        self.rows.append(line)
        return current

    def steps(self) -> int:
        return len({a.step for a in self.attempts.values()}) + sum(b - a + 1 for a, b, _ in self.idle)

    def last_step(self) -> int | None:
        return max([a.step for a in self.attempts.values()] + [b for _, b, _ in self.idle], default=None)


# -- the summary: one line per attempt -------------------------------------------------------

def _aligned(header: tuple, rows: list[tuple], right: set[int]):
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

    def fmt(row: tuple) -> str:
        return "  ".join(v.rjust(w) if i in right else v.ljust(w)
                         for i, (v, w) in enumerate(zip(row, widths))).rstrip()
    return fmt


def _result_bytes(a: Attempt) -> str:
    sizes = {b for b, _ in a.results.values()}
    if not sizes:
        return "-"
    if len(sizes) == 1 and len(a.results) == len(a.ranks):
        return f"{human_bytes(sizes.pop())} each"
    ranks = sorted(set(a.ranks) | set(a.results))
    return " ".join(human_bytes(a.results[r][0]) if r in a.results else "-" for r in ranks)


def _summary(path: str, style: Style) -> list[str]:
    log = Reader(path, keep=lambda step: False, style=style)
    log.read()
    cells = {id(a): (str(a.step), str(a.epoch), str(a.items), f"{human_bytes(a.plan_bytes)} x{len(a.ranks)}",
                     _result_bytes(a)) for a in log.attempts.values()}
    fmt = _aligned(("step".rjust(STEP_WIDTH), "epoch", "items", "plan", "result"),
                   list(cells.values()), {0, 1, 2})
    lines = [style.dim(fmt(("step".rjust(STEP_WIDTH), "epoch", "items", "plan", "result")) + "  verdict")]
    for row in log.rows:
        if isinstance(row, str):
            lines.append(row)
            continue
        verdict = row.verdict()
        lines.append(fmt(cells[id(row)]) + "  " + (style.green if verdict == "joined" else style.red)(verdict))
    n = len(log.ranks)
    lines.append(f"{log.messages} messages, {human_bytes(log.sent)} out, {human_bytes(log.received)} in; "
                 f"{log.steps()} steps in {len(log.attempts)} attempts; {n} rank{'s' * (n != 1)}")
    return lines


# -- one step: its plan, every rank's result, the join, per attempt ----------------------------

def _one_step(path: str, step: int, style: Style) -> list[str]:
    log = Reader(path, keep=lambda s: s == step, style=style)
    log.read()
    attempts = [a for a in log.attempts.values() if a.step == step]
    idle = [line for first, last, line in log.idle if first <= step <= last]
    if not attempts and not idle:
        last = log.last_step()
        known = "no steps" if last is None else f"steps 0..{last}"
        raise WorkloadError(f"{shown(path)}: no step {step} in the log ({known})")
    lines = list(idle)
    for a in attempts:
        n = len(a.items)
        lines.append(style.bold(f"step {a.step}, epoch {a.epoch}") + f": plan of {n} item{'s' * (n != 1)}, "
                     f"{human_bytes(a.plan_bytes)} to {_ranks(sorted(a.ranks))}")
        lines += _plan_table(a.items, style) + _result_table(a, style)
        verdict = a.verdict()
        lines.append(PAD + "join: " + (style.green if verdict == "joined" else style.red)(verdict))
        lines += a.lines
    return lines


def _plan_table(items: list[dict], style: Style) -> list[str]:
    header = ("item", "request", "start", "tokens", "draft", "decode", "verdict", "pages")
    rows = [(str(i), _txt(it.get("request_id")), _txt(it.get("start_position")), _txt(it.get("num_tokens")),
             _txt(it.get("draft_len")), {True: "yes", False: "no"}.get(it.get("decode"), _txt(it.get("decode"))),
             _txt(it.get("verdict_index")), _txt(it.get("placements"))) for i, it in enumerate(items)]
    fmt = _aligned(header, rows, {0, 2, 3, 4, 6})
    return [PAD + style.dim(fmt(header))] + [PAD + fmt(r) for r in rows]


def _result_table(a: Attempt, style: Style) -> list[str]:
    """Per rank, per outcome; a rank that answered exactly as the first one did says so."""
    header = ("rank", "bytes", "request", "start", "ran", "accepted", "writes")
    rows, free = [], {}                    # free: row index -> text that spans the outcome columns
    first = min(a.results, default=None)
    for rank in sorted(set(a.ranks) | set(a.results)):
        size, outcomes = a.results.get(rank, (None, None))
        if outcomes is None or (rank != first and outcomes == a.results[first][1]) or not outcomes:
            free[len(rows)] = ("no result in the log" if outcomes is None
                               else "no outcomes" if not outcomes else f"same as rank {first}")
            rows.append((str(rank), "-" if size is None else human_bytes(size)) + ("",) * 5)
            continue
        for i, o in enumerate(outcomes):
            rows.append((str(rank) if i == 0 else "", human_bytes(size) if i == 0 else "",
                         _txt(o.get("request_id")), _txt(o.get("start_position")),
                         _txt(o.get("executed_tokens")), _txt(o.get("accepted")), _txt(o.get("writes"))))
    fmt = _aligned(header, rows, {0, 1, 3, 4, 5})
    return [PAD + style.dim(fmt(header))] + [
        PAD + (fmt(r[:2]) + "  " + free[i] if i in free else fmt(r)) for i, r in enumerate(rows)]
