"""`python -m inferris_dist.cli`: the command line (the same as `inferris-dist`)."""
import sys

from inferris_dist.cli.main import main

sys.exit(main())
