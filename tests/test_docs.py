"""The documentation's examples, run: every command in README.md and docs/*.md shown with its
output is run again, and what it prints must still have the shape shown.

The convention, for whoever writes a page:

- A ```console block holds commands and their output. A line starting with `$ ` is a command;
  lines right after it starting with `> ` continue it (as a shell's second prompt does). The
  lines up to the next command are what it prints, standard output and standard error
  together, as a terminal shows them; a command shown with no lines after it prints nothing.
- The shape: sizes (`46 B`, `1.2 kB`), numbers, and a lone `-` where a number may be missing
  are masked, a run directory's random name too; a list of them joined by `/` (`rtt
  0.5/-/0.4 ms`) counts as one, as does `33 B each`, and a run of spaces as one space; so
  timings, pids, which ranks had answered and table widths may differ from run to run. A line
  that is only `...` stands for any number of lines (none included), and `...` inside a line
  for any text.
- The blocks of one page run in bash, in order, one command after the other, in one fresh
  directory in which `examples` and `tests` are the repository's (so a block may read a file an
  earlier block of its page wrote), with this interpreter's bin directory first on PATH (so
  `inferris-dist` and `python3` are the project's).
- Any other block is never run: ```sh is a command to copy (one that needs root, or takes
  long), ```text is output quoted from a run. Neither may hold a line starting with `$ `, so
  no example can show a command and its output without being checked.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from tests.helpers.external import ENV, REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


# -- reading the examples ------------------------------------------------------------------------

def fenced_blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """Every fenced block of a markdown text: (line number of its fence, its info word, its lines
    with the fence's indentation taken off)."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, info, start, body = len(m.group(1)), m.group(2), i + 1, []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i].lstrip())
            i += 1
        blocks.append((start, info, body))
        i += 1
    return blocks


def examples(lines: list[str]) -> list[tuple[str, list[str]]]:
    """A console block's (command, the output shown) pairs."""
    pairs: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        elif not pairs:
            raise ValueError(f"output before any command: {line!r}")
        elif line.startswith("> ") and not pairs[-1][1]:
            pairs[-1] = (pairs[-1][0] + "\n" + line[2:], [])
        else:
            pairs[-1][1].append(line)
    return pairs


def console_blocks(page: Path) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """(where: `page:line`, its examples) for every console block of a page, in order."""
    return [(f"{page.relative_to(REPO)}:{start}", examples(body))
            for start, info, body in fenced_blocks(page.read_text()) if info == "console"]


# -- the shape -----------------------------------------------------------------------------------

MASKS = [
    (re.compile(r"ipc://[^\s,]+"), "ipc://RUN"),                       # a run directory's name
    (re.compile(r"\d+(?:\.\d+)? (?:[kMG]i?)?B\b"), "#"),                # a size: 46 B, 1.2 kB
    (re.compile(r"(?<![\w-])-(?![\w>-])"), "#"),                        # a number missing: 0.5/-/0.4
    (re.compile(r"(?<![\w.])[+-](?=\d)"), ""),                          # a sign: +0.02, -0.38
    (re.compile(r"\d+(?:\.\d+)?"), "#"),                                # a number
    (re.compile(r"#(?:/#)+|# each\b"), "#"),                            # a list of them: 0.5/-/0.4
    (re.compile(r"\s+"), " "),
]


def shape(line: str) -> str:
    for pattern, mask in MASKS:
        line = pattern.sub(mask, line)
    return line.strip()


def mismatch(shown: list[str], printed: list[str]) -> str | None:
    """None when `printed` has the shape of `shown`; else what differs, for a failure message."""
    want = [shape(line) for line in shown]
    got = [shape(line) for line in printed]
    while got and not got[-1]:
        got.pop()
    patterns = [None if w == "..." else re.compile(".*".join(map(re.escape, w.split("...")))) for w in want]
    reached = [0, 0]           # the furthest (shown, printed) lines matched, for the message

    @lru_cache(maxsize=None)
    def match(i: int, j: int) -> bool:
        if (i, j) > tuple(reached):
            reached[:] = [i, j]
        if i == len(want):
            return j == len(got)
        if patterns[i] is None:
            return match(i + 1, j) or (j < len(got) and match(i, j + 1))
        return j < len(got) and patterns[i].fullmatch(got[j]) is not None and match(i + 1, j + 1)

    if match(0, 0):
        return None
    i, j = reached
    expected = shown[i] if i < len(shown) else "(the end of the output)"
    actual = printed[j] if j < len(printed) else "(the end of the output)"
    return (f"shown line {i + 1}: {expected!r}\nprinted line {j + 1}: {actual!r}\n"
            f"-- printed --\n" + "\n".join(printed))


# -- running them --------------------------------------------------------------------------------

def workdir(tmp_path: Path) -> Path:
    """A fresh directory where `examples` and `tests` are the repository's."""
    for name in ("examples", "tests"):
        (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


def environment(tmp_path: Path) -> dict:
    bindir = Path(sys.executable).parent
    if not (bindir / "inferris-dist").is_file():          # no console script: one on PATH for us
        bindir = tmp_path.parent / f"{tmp_path.name}-bin"
        bindir.mkdir(exist_ok=True)
        script = bindir / "inferris-dist"
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m inferris_dist.cli "$@"\n')
        script.chmod(0o755)
        (bindir / "python3").symlink_to(sys.executable)
        (bindir / "python").symlink_to(sys.executable)
    return {**ENV, "PATH": f"{bindir}{os.pathsep}{ENV.get('PATH', '')}"}


def run_example(command: str, cwd: Path, env: dict, timeout: float = 30) -> list[str]:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    return done.stdout.splitlines()


def check_blocks(blocks: list[tuple[str, list[tuple[str, list[str]]]]], tmp_path: Path) -> list[str]:
    """Run the blocks' commands in order, in one directory; one message per command whose
    output lost its shape."""
    cwd, env, failures = workdir(tmp_path), environment(tmp_path), []
    for where, pairs in blocks:
        for command, shown in pairs:
            differs = mismatch(shown, run_example(command, cwd, env))
            if differs is not None:
                failures.append(f"{where}: $ {command}\n{differs}")
    return failures


SHOWING = [page for page in PAGES if console_blocks(page)]


@pytest.mark.procs
@pytest.mark.parametrize("page", SHOWING, ids=[str(p.relative_to(REPO)) for p in SHOWING])
def test_the_examples_print_what_the_page_shows(page, tmp_path):
    failures = check_blocks(console_blocks(page), tmp_path)
    assert not failures, "\n\n".join(failures)


def test_every_page_keeps_the_convention():
    """Only console blocks show output: no other block holds a `$ ` line."""
    for page in PAGES:
        for start, info, body in fenced_blocks(page.read_text()):
            if info != "console":
                assert not any(line.startswith("$ ") for line in body), \
                    f"{page.relative_to(REPO)}:{start}: a ```{info} block with a `$ ` line (use ```console)"


def test_the_readme_shows_examples_and_the_pages_are_found():
    assert len(console_blocks(REPO / "README.md")) >= 4
    assert {"README.md", "cli.md", "faults.md", "observing.md"} <= {p.name for p in SHOWING}


# -- the checker itself: it passes what it should, and fails what it should ----------------------

SHOWN = """\
```console
$ inferris-dist launch --world-size 4
       4 rank workers up in 0.17 s at ipc:///tmp/inferris-dist-7065-_vqmeggx.run/s, pids 7069 7070
    3  run r2:4  publish r2:1  sample r2
       wire plan 46 B x4, rtt 1.17/1.40/-/1.26 ms, result 33 B/33 B/-/33 B, rank 2 lost (died)
...
rank  pid   steps
0     7069      6
$ python3 -c "print('one')
> print('two')"
one
two
```
"""


def test_a_block_is_read_as_commands_and_their_output():
    [(start, info, body)] = fenced_blocks(SHOWN)
    assert (start, info) == (1, "console")
    pairs = examples(body)
    assert [command for command, _ in pairs] == ["inferris-dist launch --world-size 4",
                                                 "python3 -c \"print('one')\nprint('two')\""]
    assert len(pairs[0][1]) == 6 and pairs[1][1] == ["one", "two"]


def test_other_numbers_pids_widths_and_a_missing_answer_keep_the_shape():
    shown = examples(fenced_blocks(SHOWN)[0][2])[0][1]
    printed = ["       4 rank workers up in 0.2 s at ipc:///tmp/inferris-dist-9-abc_1234.run/s, pids 12 13",
               "    3  run r2:4  publish r2:1  sample r2",
               "       wire plan 146 B x4, rtt 0.9/-/-/- ms, result 1.1 kB/-/-/-, rank 2 lost (died)",
               "       ! anything at all, on any number of lines",
               "       restore: ...",
               "rank  pid     steps",
               "0     123456      16"]
    assert mismatch(shown, printed) is None
    assert mismatch(["a", "..."], ["a"]) is None and mismatch(["...", "b"], ["b"]) is None
    assert mismatch(["took 1.5 s ... done"], ["took 2 s and then more done"]) is None
    assert mismatch(["3  0 (0%)  +0.02  1.11"], ["3  0 (0%)  -0.38  1.10"]) is None   # a sign is the number's
    assert mismatch(["2:slow@0+:4"], ["2:slow@0-:4"]) is not None


def test_a_different_shape_fails():
    shown = examples(fenced_blocks(SHOWN)[0][2])[0][1]
    printed = ["       4 rank workers up in 0.2 s at ipc:///tmp/x.run/s, pids 12 13",
               "    3  run r2:4  publish r2:1  sample r2",
               "       wire plan 46 B x4, rtt 0.9/0.8/0.7/0.6 ms, result 33 B each, joined",
               "rank  pid   steps",
               "0     7069      6"]
    message = mismatch(shown, printed)
    assert message is not None and "shown line 3" in message and "33 B each, joined" in message
    assert mismatch(["one", "two"], ["one"]) is not None                  # a line missing
    assert mismatch(["one"], ["one", "two"]) is not None                  # a line too many
    assert mismatch(["exit status 0"], ["exit status 1"]) is None         # digits are masked ...
    assert mismatch(["exit status 0"], ["exit code 0"]) is not None       # ... words are not
    assert mismatch([], ["something"]) is not None                        # said to print nothing


@pytest.mark.procs
def test_a_page_whose_example_lost_its_shape_fails_the_check(tmp_path):
    """The whole way, from a page's text to a failure: a command that prints another shape."""
    page = "```console\n$ echo one two; echo three\none two\n$ inferris-dist --version\nnot this\n```\n"
    [(_, _, body)] = fenced_blocks(page)
    failures = check_blocks([("page:1", examples(body))], tmp_path)
    assert len(failures) == 2, failures
    assert "printed line 2: 'three'" in failures[0] and "(the end of the output)" in failures[0]
    assert "inferris-dist --version" in failures[1] and "printed line 1: 'inferris-dist" in failures[1]
