"""The conformance kit: a rank worker started by any command, tried against what the wire
promises (docs/protocol.md), case by case (cases.py), on the real scheduler and on a scripted
one (scripted.py), run and graded (runner.py) and told (report.py). `inferris-dist conform` is
its command line (docs/conform.md)."""
