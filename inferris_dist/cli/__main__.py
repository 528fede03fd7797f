"""`python -m inferris_dist.cli`: the command line (the same as `inferris-dist`)."""
from inferris_dist.cli.console import entry

entry()
