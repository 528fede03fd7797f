"""`python -m inferris_dist.rank`: a rank worker (the same as `inferris-dist worker`)."""
import sys

from inferris_dist.rank.cli import main

sys.exit(main())
