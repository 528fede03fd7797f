"""inferris_dist: the engine's executor on real processes, and the command line."""
