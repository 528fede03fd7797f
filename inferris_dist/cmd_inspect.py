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
            and all(_is_int(obj.get(k)) for k in ("rank", "epoch", "step", "bytes")))


def _records(path: str) -> Iterator[dict]:
    name = shown(str(path))
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
                if not isinstance(obj, dict) or not (isinstance(obj["event"], str) if "event" in obj
                                                     else _is_message(obj)):
                    raise WorkloadError(f"{name} line {n}: neither a wire message nor an event")
                if "event" not in obj and obj["type"] in ("PLAN", "RESULT") and not _body_ok(obj):
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
    where = ("during start-up" if g("step") is None
             else f"at step {_txt(g('step'))}, epoch {_txt(g('epoch'))}")
    if kind == "rank-lost":
        return PAD + style.red(f"! rank lost {where}: {_txt(g('message'))}")
    if kind == "step-failed":
        return PAD + style.red(f"! {_txt(g('kind'))} {where}: {_txt(g('message'))}")
    if kind == "audit-failed":
        return PAD + style.red(f"! audit failed {where}: {_txt(g('message'))}")
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
    failed: str = ""                        # what a step-failed or rank-lost event said of it
    why: str = ""                           # that event's message
    lines: list[str] = field(default_factory=list)   # its other events (--step)

    def answered(self) -> bool:
        return bool(self.ranks) and all(r in self.results for r in self.ranks)

    def verdict(self) -> str:
        # RESULTs are logged only once every rank answered and decoded: the join alone can fail then.
        return self.failed or ("joined" if self.answered() else "no answer in the log")


class Reader:
    """The one pass both views share. The summary (step None) keeps a small record per attempt
    and its event lines; --step K keeps only step K's attempts, whole."""

    def __init__(self, path: str, step: int | None, style: Style):
        self.path, self.step, self.style = path, step, style
        self.attempts: dict[tuple[int, int], Attempt] = {}
        self.rows: list[Attempt | str] = []       # attempts and event lines, in the log's order
        self.current: Attempt | None = None       # the attempt under way: a note is about it
        self.messages = self.sent = self.received = 0
        self.ranks: set[int] = set()
        self.steps: set[int] = set()              # planned (the summary's only: --step needs `last`)
        self.idle_steps, self.last = 0, -1
        self.idle: list[str] = []                 # the idle stretch holding step K, if it is one

    def read(self) -> "Reader":
        for obj in _records(self.path):
            if "event" in obj:
                self._event(obj)
                continue
            self.messages += 1
            self.sent += obj["bytes"] if obj["dir"] == "out" else 0
            self.received += obj["bytes"] if obj["dir"] == "in" else 0
            self.ranks.add(obj["rank"])
            if obj["type"] == "PLAN":
                self.last = max(self.last, obj["step"])
                if self.step is None:
                    self.steps.add(obj["step"])
                self.current = self._plan(obj) if self.step in (None, obj["step"]) else None
            elif obj["type"] == "RESULT" and _key(obj) in self.attempts:
                body = obj["body"] if self.step is not None else None   # the summary needs sizes only
                self.attempts[_key(obj)].results[obj["rank"]] = (obj["bytes"], body)
        if not self.messages:
            raise WorkloadError(f"{shown(str(self.path))}: no messages in the log")
        return self

    def _plan(self, msg: dict) -> Attempt:
        a = self.attempts.get(_key(msg))
        if a is None:                             # every rank gets the same plan bytes: keep one
            items = msg["body"]["items"]
            a = Attempt(msg["step"], msg["epoch"], msg["bytes"], len(items) if self.step is None else items)
            self.attempts[_key(msg)] = a
            self.rows.append(a)
        a.ranks.append(msg["rank"])
        return a

    def _event(self, ev: dict) -> None:
        line = _event_line(ev, self.style)
        first, last = ev.get("first"), ev.get("last")
        if ev["event"] == "idle" and _is_int(first) and _is_int(last) and first <= last:
            self.idle_steps += last - first + 1
            self.last = max(self.last, last)
            if self.step is not None and first <= self.step <= last:
                self.idle.append(line)
        # The verdict of the attempt it names; a rank lost after every rank answered was lost
        # in the audit that followed: an event, not the verdict.
        at = self.attempts.get(_key(ev)) if _key(ev) else None
        if at is not None and (ev["event"] == "step-failed"
                               or ev["event"] == "rank-lost" and not at.answered()):
            at.failed = _txt(ev.get("kind")) if ev["event"] == "step-failed" else _lost(ev)
            at.why = _txt(ev.get("message"))
            if self.step is not None:
                return                            # --step says it on the join line
        if self.step is None:
            self.rows.append(line)
        # Under step K: the events naming step K (a restart names the step it repeats), and
        # those naming no step (a note) that came while one of step K's attempts was under way.
        elif self.rows and (ev.get("step") == self.step if _is_int(ev.get("step"))
                            else self.current is not None):
            self.rows[-1].lines.append(line)


# -- the summary: one line per attempt -------------------------------------------------------

def _aligned(header: tuple, rows: list[tuple], right: set[int]):
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

    def fmt(row: tuple, strip: bool = True) -> str:
        line = "  ".join(v.rjust(w) if i in right else v.ljust(w)
                         for i, (v, w) in enumerate(zip(row, widths)))
        return line.rstrip() if strip else line
    return fmt


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _painted(verdict: str, style: Style, why: str = "") -> str:
    return (style.green if verdict == "joined" else style.red)(verdict + (f": {why}" if why else ""))


def _result_bytes(a: Attempt) -> str:
    sizes = {b for b, _ in a.results.values()}
    if not sizes:
        return "-"
    if len(sizes) == 1 and len(a.results) == len(a.ranks):
        return f"{human_bytes(sizes.pop())} each"
    ranks = sorted(set(a.ranks) | set(a.results))
    return " ".join(human_bytes(a.results[r][0]) if r in a.results else "-" for r in ranks)


def _summary(path: str, style: Style) -> list[str]:
    log = Reader(path, None, style).read()
    cells = {id(a): (str(a.step), str(a.epoch), str(a.items),
                     f"{human_bytes(a.plan_bytes)} x{len(a.ranks)}", _result_bytes(a))
             for a in log.attempts.values()}
    header = ("step".rjust(STEP_WIDTH), "epoch", "items", "plan", "result")
    fmt = _aligned(header, list(cells.values()), {0, 1, 2})
    lines = [style.dim(fmt(header, strip=False) + "  verdict")]
    for row in log.rows:
        if isinstance(row, str):
            lines.append(row)
            continue
        lines.append(fmt(cells[id(row)], strip=False) + "  " + _painted(row.verdict(), style))
    steps = len(log.steps) + log.idle_steps
    lines.append(f"{_count(log.messages, 'message')}, {human_bytes(log.sent)} out, "
                 f"{human_bytes(log.received)} in; {_count(steps, 'step')} in "
                 f"{_count(len(log.attempts), 'attempt')}; {_count(len(log.ranks), 'rank')}")
    return lines


# -- one step: its plan, every rank's result, the join, per attempt ----------------------------

def _one_step(path: str, step: int, style: Style) -> list[str]:
    log = Reader(path, step, style).read()
    attempts = list(log.attempts.values())
    if not attempts and not log.idle:
        known = "no steps" if log.last < 0 else f"steps 0..{log.last}"
        raise WorkloadError(f"{shown(str(path))}: no step {step} in the log ({known})")
    lines = list(log.idle)
    for a in attempts:
        plan = f"{_count(len(a.items), 'item')}, {human_bytes(a.plan_bytes)} to {_ranks(sorted(a.ranks))}"
        lines.append(style.bold(f"step {a.step}, epoch {a.epoch}") + f": plan of {plan}")
        lines += _plan_table(a.items, style) + _result_table(a, style)
        lines.append(PAD + "join: " + _painted(a.verdict(), style, a.why))
        lines += a.lines
    return lines


def _plan_table(items: list[dict], style: Style) -> list[str]:
    header = ("item", "request", "start", "tokens", "draft", "decode", "verdict", "pages")
    yes_no = {True: "yes", False: "no"}
    rows = [(str(i), *(_txt(it.get(k)) for k in ("request_id", "start_position", "num_tokens", "draft_len")),
             yes_no.get(it.get("decode")) or _txt(it.get("decode")), _txt(it.get("verdict_index")),
             _txt(it.get("placements"))) for i, it in enumerate(items)]
    fmt = _aligned(header, rows, {0, 2, 3, 4, 6})
    return [PAD + style.dim(fmt(header))] + [PAD + fmt(r) for r in rows]


def _result_table(a: Attempt, style: Style) -> list[str]:
    """Per rank, per outcome; a rank that answered exactly as the first one did says so."""
    header = ("rank", "bytes", "request", "start", "ran", "accepted", "writes")
    if not a.results:
        return [PAD + "results: none in the log"]
    rows, free = [], {}                    # free: row index -> text that spans the outcome columns
    first = min(a.results)
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
