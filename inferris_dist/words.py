"""How things from a run are said in text, for a terminal and for the page alike: a string
from outside made safe to show (`shown`), colour that is there only on a terminal (`Style`),
and one step's events in a line (`step_events`). The command line's rendering (cli/render)
and the page's model (inferris_dist/page) both say things this way, so a step reads the same in
`launch`'s output, in `inspect` and on the page.
"""
from __future__ import annotations

import os
from typing import TextIO

from inferris_dist.engine import StepTrace


class Style:
    """ANSI colour where it is on (a terminal, NO_COLOR unset); plain text where it is off."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    @classmethod
    def for_stream(cls, stream: TextIO) -> "Style":
        return cls(hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("NO_COLOR"))

    def _wrap(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled else text

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)

    def green(self, text: str) -> str:
        return self._wrap("32", text)

    def yellow(self, text: str) -> str:
        return self._wrap("33", text)


PLAIN = Style(False)


def shown(text: str) -> str:
    """A string from outside (a request id, a file name, a peer's words) made safe for a
    terminal: every character that is not printable (newlines, escape sequences, bidi
    controls) shows as its escape, so nobody can forge a line or clear the screen."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def step_events(t: StepTrace, style: Style, limit: int | None = None) -> str:
    """What happened in one step, in phase order, each kind once and only if it happened.

    `limit`: at most that many requests named per kind, then "+N more" (and, for what
    ran, the token total), so that a big batch still fits one line.
    """
    parts = []
    s = shown        # request ids are the user's: shown escaped

    def add(label: str, entries: list[str], paint=None, tokens: int | None = None) -> None:
        total = f" ({tokens} tok)" if tokens is not None else ""
        if limit == 0:
            entries = [f"{len(entries)}{total}"]
        elif limit is not None and len(entries) > limit:
            entries = entries[:limit] + [f"+{len(entries) - limit} more{total}"]
        parts.append(f"{(paint or style.dim)(label)} {' '.join(entries)}")

    if t.admitted:
        add("admit", list(map(s, t.admitted)))
    if t.reused:
        add("reuse", [f"{s(r)}:{n}" for r, n in t.reused.items()])
    if t.evicted:
        pages = t.evicted if limit is None or len(t.evicted) <= 4 * max(limit, 1) else None
        parts.append(f"{style.yellow('evict')} " + (f"pages {','.join(map(str, pages))}" if pages
                                                     else f"{len(t.evicted)} pages"))
    if t.preempted:
        add("preempt", list(map(s, t.preempted)), style.yellow)
    if t.executed:
        add("run", [f"{s(r)}:{n}" for r, n in t.executed.items()], tokens=sum(t.executed.values()))
    drafts = [f"{s(r)}:{t.accepted[r]}/{d}" for r, d in t.drafted.items() if d]   # 0/0 says nothing
    if drafts:
        add("accept", drafts)
    if t.published:
        add("publish", [f"{s(r)}:{n}" for r, n in t.published.items()])
    if t.sampled:
        add("sample", [s(r) if v == "TOKEN" else f"{s(r)}:{v}" for r, v in t.sampled.items()])
    if t.finished:
        add("finish", [f"{s(r)}:{why}" for r, why in t.finished.items()], style.green)
    if t.returned:                     # overlap: placeholders the next step assumed, given back
        add("return", [f"{s(r)}:{n}" for r, n in t.returned.items()])
    if t.discarded:                    # overlap: items planned from an EOS nobody could foresee
        add("discard", [f"{s(r)}:{n}" for r, n in t.discarded.items()], style.yellow,
            tokens=sum(t.discarded.values()))
    return "  ".join(parts)
