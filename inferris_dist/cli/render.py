"""Human output: one aligned line per step saying only what happened, then the requests.

Plain text unless stdout is a terminal (and NO_COLOR is unset); never a
Python repr. `--json` output is not made here: it is SPEC §4, line for line.
"""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, TextIO

from inferris_dist.words import PLAIN, Style, shown, step_events

if TYPE_CHECKING:
    from inferris_dist.engine import StepTrace, Workload

# Style, shown and step_events live in inferris_dist/words.py, with the page that says things the
# same way; they are used here and through this module by the commands.

STEP_WIDTH = 5
DEFAULT_WIDTH = 100


def line_width(stream: TextIO) -> int:
    """COLUMNS when the user set it (a pipe too), else the terminal's width when `stream` is one,
    else DEFAULT_WIDTH."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isascii() and columns.isdigit() and 0 < int(columns) < 100_000:
        return max(40, int(columns))
    try:
        if stream.isatty():
            return max(40, os.get_terminal_size(stream.fileno()).columns)
    except (AttributeError, OSError, ValueError):
        pass
    return DEFAULT_WIDTH


def header(workload: Workload, title: str) -> str:
    c = workload.config
    n = len(workload.requests)
    return (f"{shown(title)}: {n} request{'s' * (n != 1)}, max_step_tokens {c.max_step_tokens}, "
            f"page_size {c.page_size}, num_pages {c.num_pages}, spec_len {c.spec_len}, "
            f"world_size {c.world_size}")


LIMITS = (8, 4, 2, 1, 0)     # requests named per kind, tried in turn until a step line fits


def step_line(t: StepTrace, style: Style, width: int | None = None) -> str:
    """The step's line; with `width`, big batches are summarised until it fits (the full
    listing is what `--verbose` gives)."""
    if width is not None:
        for limit in (None,) + LIMITS:
            plain = f"{t.step:>{STEP_WIDTH}}  {step_events(t, PLAIN, limit) or 'idle'}"
            if len(plain) <= width or limit == 0:
                return f"{t.step:>{STEP_WIDTH}}  {step_events(t, style, limit) or style.dim('idle')}"
    return f"{t.step:>{STEP_WIDTH}}  {step_events(t, style) or style.dim('idle')}"


def idle_line(first: int, last: int, style: Style) -> str:
    label = str(first) if first == last else f"{first}-{last}"
    return f"{label:>{STEP_WIDTH}}  {style.dim('idle, waiting for arrivals')}"


class StepPrinter:
    """Prints step lines; a run of idle steps becomes one line; a step fits `width` columns
    (the terminal's, or 100) unless `verbose`."""

    def __init__(self, out: TextIO, style: Style, verbose: bool = False):
        self.out = out
        self.style = style
        self.width = None if verbose else line_width(out)
        self._idle: tuple[int, int] | None = None

    def step(self, t: StepTrace) -> None:
        if t.is_empty:
            first = self._idle[0] if self._idle else t.step
            self._idle = (first, t.step)
            return
        self.flush()
        self.out.write(step_line(t, self.style, self.width) + "\n")

    def flush(self) -> None:
        if self._idle:
            self.out.write(idle_line(*self._idle, self.style) + "\n")
            self._idle = None


def request_table(summary: list[dict], style: Style) -> str:
    cols = ("request", "state", "generated", "computed", "finish")
    rows = [(shown(s["request_id"]), s["state"], str(s["generated"]), str(s["computed"]),
             s["finish_reason"] or "-") for s in summary]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(cols)]
    right = {2, 3}

    def fmt(row) -> str:
        return "  ".join(v.rjust(w) if i in right else v.ljust(w)
                         for i, (v, w) in enumerate(zip(row, widths))).rstrip()

    lines = [style.dim(fmt(cols))] + [fmt(r) for r in rows]
    return "\n".join(lines)


def closing_line(num_steps: int, summary: list[dict]) -> str:
    done = sum(1 for s in summary if s["state"] == "FINISHED")
    return f"{num_steps} step{'s' * (num_steps != 1)}, {done}/{len(summary)} requests finished"


def write_error(err, out: TextIO, style: Style) -> None:
    where = "during start-up" if err.step is None else f"at step {err.step}"
    if err.epoch is not None:
        where += f", epoch {err.epoch}"
    out.write(style.red(f"error: {err.kind} {where}: {shown(err.message)}") + "\n")
    for line in getattr(err, "wavefront", ()):
        out.write(f"  {line}\n")


# -- what crossed the boundary (launch) ------------------------------------------------

def human_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} kB"
    return f"{n / (1024 * 1024):.1f} MB"


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def boundary_line(record, world_size: int, style: Style, shown_step: int | None = None) -> str:
    """The wire under a step: plan out, round trips, results back, and the join's verdict."""
    rtts = "/".join(ms(record.rtt.get(r)) for r in range(world_size))
    got = record.result_bytes
    sizes = set(got.values())
    if not got:
        result = "-"                                      # no rank answered: nothing came back
    elif len(sizes) == 1 and len(got) == world_size:
        result = f"{human_bytes(sizes.pop())} each"
    else:
        result = "/".join(human_bytes(got[r]) if r in got else "-" for r in range(world_size))
    verdict = record.verdict or "-"
    verdict = style.green(verdict) if verdict == "joined" else style.red(verdict)
    epoch = f"epoch {record.epoch}, " if record.epoch else ""
    if shown_step is not None:
        epoch = f"step {shown_step}, " + epoch
    return style.dim(f"{'':>{STEP_WIDTH}}  wire {epoch}plan {human_bytes(record.plan_bytes)} x{world_size}, "
                     f"rtt {rtts} ms, result {result}, ") + verdict


def failed_step_lines(err, style: Style) -> tuple[str, str]:
    """The step a run ended at (abort, or recovery given up): its number, then the diagnosis
    under its wire line, as a survived failure shows them."""
    head = f"{err.step:>{STEP_WIDTH}}  " + style.red("failed: nothing committed")
    epoch = f", epoch {err.epoch}" if err.epoch is not None else ""
    why = f"{'':>{STEP_WIDTH}}  " + style.red(f"! {err.kind} at step {err.step}{epoch}: {shown(err.message)}")
    return head, why


def note_lines(record, style: Style) -> list[str]:
    return [f"{'':>{STEP_WIDTH}}  " + style.yellow(f"! {shown(note)}") for note in record.notes]


MAX_PIDS_SHOWN = 5      # a rank's worker pids in its row, before the middle ones are counted


def rank_table(totals: dict, pids: dict[int, list[int]], style: Style,
               hosts: dict[int, list[str]] | None = None) -> str:
    """Per rank: its worker pids (a restart adds one; @host for members from other hosts),
    steps, bytes, round trips, drops."""
    cols = ("rank", "pid", "steps", "sent", "received", "rtt p50 ms", "rtt p99 ms", "dropped")

    def who(r: int) -> str:
        at = hosts.get(r, []) if hosts is not None else []
        shown = [f"{p}@{at[i]}" if i < len(at) and at[i] else str(p) for i, p in enumerate(pids.get(r, []))]
        if len(shown) > MAX_PIDS_SHOWN:     # many restarts: the first two, a count, the last two
            shown = [*shown[:2], f"...({len(shown) - 4} more)", *shown[-2:]]
        return "->".join(shown) or "-"

    rows = [(str(r), who(r), str(t.steps), human_bytes(t.bytes_sent),
             human_bytes(t.bytes_received), ms(t.percentile(0.5)), ms(t.percentile(0.99)),
             str(t.dropped)) for r, t in sorted(totals.items())]
    widths = [max([len(c)] + [len(row[i]) for row in rows]) for i, c in enumerate(cols)]

    def fmt(row) -> str:
        return "  ".join(v.rjust(w) if i >= 2 else v.ljust(w)
                         for i, (v, w) in enumerate(zip(row, widths))).rstrip()

    return "\n".join([style.dim(fmt(cols))] + [fmt(row) for row in rows])


def resize_text(r) -> str:
    """The world changed size (mechanism 14), in words: who was kept, lost or added."""
    z = r.resize
    moved = [f"{old}->{new}" for new, old in enumerate(z.kept) if old != new]
    words = f"world size {z.old} -> {z.new} in epoch {z.epoch}"
    if z.lost:
        words += f", without rank{'s' * (len(z.lost) > 1)} {', '.join(map(str, z.lost))}"
    if moved:
        words += f"; renumbered {' '.join(moved)}"
    if z.added:
        joined = zip(r.restarted, r.pids)
        words += "; joined: " + ", ".join(f"rank {rank} as pid {pid}" for rank, pid in joined)
    words += f"; every rank holds the pool ({z.shard_pages} pages)"
    if z.hidden is not None:
        words += (f"; {z.hidden:.2f} s of start-up ran while the steps went on, "
                  f"the steps waited {1000 * r.waited:.1f} ms")
    return words


def arrivals_lines(arrivals, run_seconds: float | None, style: Style) -> list[str]:
    """At the boundary, when a straggler is named: per rank how often it came last to the
    join, its median lateness behind the others, its median execute time and its score over
    the best rank's; then what the lockstep cost (the group waiting for its last rank) and the
    straggler. Quiet when none is (the --metrics document has the figures either way)."""
    if arrivals.straggler() is None:
        return []
    cols = ("rank", "last", "late p50 ms", "exec p50 ms", "score")
    rows = [(str(x.rank), f"{x.last} ({100 * x.last / arrivals.steps:.0f}%)",
             "-" if x.lateness is None else f"{1000 * x.lateness:+.2f}",
             "-" if x.execute is None else f"{1000 * x.execute:.2f}",
             "-" if x.score is None else f"{x.score:.2f}x") for x in arrivals.table()]
    widths = [max([len(c)] + [len(row[i]) for row in rows]) for i, c in enumerate(cols)]

    def fmt(row) -> str:
        return "  ".join(v.rjust(w) if i >= 1 else v.ljust(w)
                         for i, (v, w) in enumerate(zip(row, widths))).rstrip()
    share = f" ({100 * arrivals.waited / run_seconds:.1f}% of the run)" if run_seconds else ""
    waited = (f"the join waited {1000 * arrivals.waited:,.1f} ms for the last rank over "
              f"{arrivals.steps:,} steps{share}")
    return [style.dim(fmt(cols)), *map(fmt, rows), waited, arrivals.verdict()]


def recovery_lines(r, style: Style) -> str:
    """A failure survived: what failed, then what the policy did (a world grown back, between
    two steps, has no failure: one line)."""
    pad = f"{'':>{STEP_WIDTH}}  "
    if r.resize is not None and r.kind == "grow":
        return f"{pad}{style.yellow(f'{r.policy}: {resize_text(r)}')}"
    failed = style.red(f"! {r.kind} at step {r.step}, epoch {r.epoch}: {shown(r.message)}")
    if r.wavefront:
        failed += "".join(f"\n{pad}  {style.dim(line)}" for line in r.wavefront)
    if r.resize is not None:
        then = "audited again" if r.in_audit else "the same plan again"
        return f"{pad}{failed}\n{pad}{style.yellow(f'shrink: {resize_text(r)}; {then}')}"
    ranks = ", ".join(f"rank {rank} as pid {pid}" + (f" at {r.hosts[i]}" if r.hosts else "")
                      for i, (rank, pid) in enumerate(zip(r.restarted, r.pids)))
    how = "replaced by a worker that joined:" if r.hosts else "restarted"
    if r.policy == "restore":
        then = "audited again" if r.in_audit else "the same plan again"
        done = (f"restore: {how} {ranks} in epoch {r.epoch + 1}, shard rebuilt from the pool "
                f"({r.shard_pages} pages); {then}")
    else:
        lost = " ".join(map(shown, r.preempted)) or "nothing"
        then = "audited again" if r.in_audit else "the step planned again"
        done = (f"recompute: {how} {ranks} empty in epoch {r.epoch + 1}; every page dropped, "
                f"preempted {lost}; {then}")
    return f"{pad}{failed}\n{pad}{style.yellow(done)}"


class LiveLine:
    """One line on a terminal, redrawn in place at most ten times a second and erased at the
    end; never written anywhere but a terminal (stderr), never into stdout."""

    EVERY_S = 0.1

    def __init__(self, stream: TextIO, enabled: bool | None = None):
        self.stream = stream
        if enabled is None:
            enabled = hasattr(stream, "isatty") and stream.isatty()
        self.enabled = enabled
        self.next_draw = 0.0
        self.drawn = False

    def due(self) -> bool:
        """Whether a redraw is due now (and if so, the next one is a tenth of a second away)."""
        now = time.monotonic()
        if now < self.next_draw:
            return False
        self.next_draw = now + self.EVERY_S
        return True

    def draw(self, text: str) -> None:
        self.stream.write(f"\r\x1b[K{text}")
        self.stream.flush()
        self.drawn = True

    def clear(self) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.drawn = False


class Progress(LiveLine):
    """A sign of life while a run steps: step, requests finished, steps per second (and for
    launch, the ranks' round trip)."""

    def __init__(self, stream: TextIO, total: int, enabled: bool | None = None):
        super().__init__(stream, enabled)
        self.total = total
        self.started = None               # the first step's time: start-up is not a step

    def update(self, step: int, finished: int, extra: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.started is None:
            self.started, self.first_step = now, step
            self.next_draw = now + self.EVERY_S
            return
        if not self.due():
            return
        rate = (step - self.first_step) / max(now - self.started, 1e-9)
        self.draw(f"step {step} · {finished}/{self.total} finished · {rate:,.0f} steps/s{extra}")
