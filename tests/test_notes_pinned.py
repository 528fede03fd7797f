"""The mechanism notes (docs/mechanisms/): twelve, in the original order, each with the
sections a reader expects, every numbered invariant pinned by a test marked with its id,
no test pinning an invariant that no note states, and every "See it" command working."""
from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from inferris_dist.cli.mechanisms import MECHANISMS

from tests.helpers.external import CLI, ENV, REPO

pytestmark = pytest.mark.timeout(120)

NOTES = REPO / "docs" / "mechanisms"
SECTIONS = ["## The problem", "## Invariants", "## The smallest state machine", "## Where it lives",
            "## What the trace shows", "## See it"]
STATED = re.compile(r"^\s*\d+\.\s+\*\*\[([a-z-]+/\d+)\]\*\*", re.M)
PINNED = re.compile(r"""mark\.invariant\(\s*["']([a-z-]+/\d+)["']""")


def stated() -> dict[str, str]:
    """Invariant id -> the note that states it."""
    ids = {}
    for m in MECHANISMS:
        for found in STATED.findall(m.note.read_text()):
            ids[found] = m.note.name
    return ids


def pinned() -> dict[str, list[str]]:
    """Invariant id -> the test files whose tests are marked with it."""
    ids: dict[str, list[str]] = {}
    for path in sorted((REPO / "tests").glob("test_*.py")):
        for found in PINNED.findall(path.read_text()):
            ids.setdefault(found, []).append(path.name)
    return ids


def test_there_is_a_note_per_mechanism_and_no_other():
    assert sorted(p.name for p in NOTES.glob("*.md")) == sorted(m.note.name for m in MECHANISMS)


@pytest.mark.parametrize("m", MECHANISMS, ids=[m.slug for m in MECHANISMS])
def test_a_note_has_every_section_in_order(m):
    text = m.note.read_text()
    assert text.startswith(f"# {m.number}. "), text[:40]
    at = [text.find(s) for s in SECTIONS]
    assert all(i >= 0 for i in at) and at == sorted(at), dict(zip(SECTIONS, at))
    ids = STATED.findall(text)
    assert ids, "no numbered invariants"
    assert all(i.startswith(m.slug + "/") for i in ids), ids
    assert [int(i.split("/")[1]) for i in ids] == list(range(1, len(ids) + 1)), ids


def test_every_invariant_is_pinned_by_a_test_and_every_pin_names_one():
    notes, tests = stated(), pinned()
    unpinned = sorted(set(notes) - set(tests))
    assert not unpinned, f"invariants no test pins: {unpinned}"
    unknown = sorted(set(tests) - set(notes))
    assert not unknown, f"tests pin invariants no note states: {unknown}"


def see_it(m) -> list[str]:
    text = m.note.read_text()
    block = re.search(r"## See it\n.*?```[a-z]*\n(.*?)```", text, re.S)
    assert block, f"{m.note.name}: no code block under 'See it'"
    return [line for line in block.group(1).splitlines() if line.strip()]


@pytest.mark.parametrize("m", MECHANISMS, ids=[m.slug for m in MECHANISMS])
def test_see_it_is_two_commands_that_run(m):
    lines = see_it(m)
    assert len(lines) == 2, lines
    for line in lines:
        argv = shlex.split(line.removeprefix("$ "))
        assert argv[0] == "inferris-dist", line
        done = subprocess.run([*CLI, *argv[1:]], env=ENV, capture_output=True, text=True,
                              timeout=60, cwd=REPO)
        assert done.returncode in (0, 1), (line, done.stderr)     # 1: a rung that fails on purpose
        assert "Traceback" not in done.stderr and done.stdout, line
