#!/usr/bin/env bash
# Break the executor on purpose and watch what happens, on real processes.
# Run from the project root after `make demo` (it uses .venv/bin/inferris-dist).
set -u
cli=${CLI:-.venv/bin/inferris-dist}
show() { printf '\n$ %s\n' "$*"; "$@"; printf '(exit status %s)\n' "$?"; }

# 1. A rank is SIGKILLed at step 3 (the fault is in the workload file): the default
#    policy stops the run and says which rank, step and epoch.
show "$cli" launch --spec examples/faulty.spec.json

# 2. The same fault, survived: a fresh worker gets its shard rebuilt from the
#    control plane's pool and the same plan goes out again. The trace is unchanged.
show "$cli" launch --spec examples/faulty.spec.json --on-rank-loss restore

# 3. A rank that hangs, survived the way a GPU rank would come back: empty. The
#    control plane drops every page and recomputes; the summary is unchanged.
show "$cli" launch --fault 1:hang@2 --step-timeout 0.5 --on-rank-loss recompute

# 4. A rank that lies: it agrees with nobody, and nobody outvotes anybody.
show "$cli" launch --fault 3:disagree@1

# 5. A fault that keeps coming back exhausts the restarts.
show "$cli" launch --fault 0:crash@1+ --on-rank-loss restore --max-restarts 2
