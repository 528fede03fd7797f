"""`inferris-dist mechs [NAME]`: the mechanisms of the ladder, where they live, or one's note."""
from __future__ import annotations

import sys

from inferris_dist.cli.args import EXIT_OK, UsageError


def add_arguments(me) -> None:
    me.add_argument("name", nargs="?", metavar="NAME", help="a mechanism: number, slug or name")


def main(args) -> int:
    from inferris_dist.cli.mechanisms import MECHANISMS
    from inferris_dist.cli.mechanisms import find as find_mechanism
    if args.name is not None:
        m = find_mechanism(args.name)
        if m is None:
            raise UsageError(f"inferris-dist mechs: no mechanism {args.name!r}; one of "
                             f"{', '.join(x.slug for x in MECHANISMS)}")
        try:
            sys.stdout.write(m.note.read_text())
        except OSError as e:
            raise UsageError(f"inferris-dist mechs: cannot read the note {m.note}: "
                             f"{e.strerror or e}") from None
        return EXIT_OK
    rows = [("#", "mechanism", "key question", "rung", "module", "tests")] + [
        (m.number, m.name + (" *" if m.beyond else ""), m.question, m.rung, m.module, m.tests)
        for m in MECHANISMS]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        sys.stdout.write("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() + "\n")
    sys.stdout.write("* beyond the original design: the original ladder ends at 12\n")
    sys.stdout.write("inferris-dist mechs NAME prints a mechanism's note (docs/mechanisms/)\n")
    return EXIT_OK
