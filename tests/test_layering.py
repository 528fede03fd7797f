"""The shape of the house (ARCHITECTURE.md), checked by imports:

- `engine` imports neither `inferris_dist` nor `launcher` (and no third-party package);
- `launcher` imports nothing of ours;
- a rank worker loads the rank executor and the wire codec, and nothing of the control plane
  (no scheduler, residency, caching, step loop, recovery, launcher), checked on a freshly
  started worker process.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parent.parent
OURS = {"engine", "inferris_dist", "launcher"}
STDLIB = set(sys.stdlib_module_names)


def imports_of(package: str) -> dict[str, set[str]]:
    """Module -> the top-level packages it imports (absolute imports only; relative stay inside)."""
    out = {}
    for path in sorted((REPO / package).glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        out[f"{package}/{path.name}"] = names
    return out


def test_engine_imports_nothing_but_the_standard_library():
    for module, names in imports_of("engine").items():
        assert names <= STDLIB, f"{module} imports {sorted(names - STDLIB)}"


def test_launcher_imports_nothing_of_ours():
    for module, names in imports_of("launcher").items():
        assert not names & OURS, f"{module} imports {sorted(names & OURS)}"


CONTROL_PLANE = {"engine.step", "engine.scheduler", "engine.residency", "engine.caching",
                 "engine.prefix", "engine.pool", "engine.workload", "engine.speculation",
                 "engine.boundary", "inferris_dist.group", "inferris_dist.channel",
                 "inferris_dist.recovery", "inferris_dist.entry", "inferris_dist.cli",
                 "inferris_dist.handshake", "inferris_dist.members", "inferris_dist.cmd_launch",
                 "inferris_dist.render", "launcher", "launcher.process", "launcher.template"}


def test_a_fresh_worker_loads_only_what_a_rank_needs():
    probe = ("import json, sys\n"
             "import inferris_dist.worker\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('engine', 'inferris_dist', 'launcher'))))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert {"engine.rank", "engine.shard", "engine.messages", "inferris_dist.wire"} <= loaded
    assert not loaded & CONTROL_PLANE, f"a worker loads the control plane: {sorted(loaded & CONTROL_PLANE)}"
    assert not any(m.startswith("asyncio") for m in json.loads(subprocess.run(
        [sys.executable, "-c",
         "import json, sys, inferris_dist.worker; print(json.dumps(list(sys.modules)))"],
        capture_output=True, text=True, timeout=30, cwd=REPO).stdout))
