"""The shape of the house (docs/ARCHITECTURE.md), checked by imports, as rules over package
prefixes (every module, every import, those inside functions too):

    engine            the standard library only
    launcher          nothing of ours
    protocol          engine, and itself
    rank              protocol and engine (a rank loads nothing of the control plane)
    words             engine (how a run is said in text: shared by the readers and the command line)
    wirelog           protocol, engine, words (the wire log's schema, writer and reader)
    observe           wirelog, protocol and engine
    judge             wirelog, words, protocol, engine (what a policy promises, a recorded
                      history checked, the control plane's invariants: judged, nothing run)
    scheduler         protocol, observe, wirelog, engine, launcher
    page              wirelog, words, engine (the offline page of a wire log)
    live              page, wirelog, words, protocol, engine (a run watched as it runs)
    chaos             engine, scheduler, judge, observe, protocol, launcher (schedules drawn from a
                      seed, run on processes, judged, a break shrunk to a reproducer)
    testing           engine, chaos, judge (the public API for a user's fault tests: a thin face on
                      the rooms that do the work)
    cli               anything

so no arrow runs back up and there is no circle between the parts. A freshly started worker
is checked too: it loads the rank executor and the wire codec, nothing of the control plane.
"""
from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.external import REPO

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]

STDLIB = set(sys.stdlib_module_names)
THIRD_PARTY = {"zmq", "msgpack", "prometheus_client"}
PARTS = {   # a part -> the parts it may import (besides itself, the stdlib and THIRD_PARTY)
    "engine": set(),
    "launcher": set(),
    "protocol": {"engine"},
    "rank": {"protocol", "engine"},
    "words": {"engine"},
    "wirelog": {"protocol", "engine", "words"},
    "observe": {"protocol", "engine", "wirelog"},
    "judge": {"protocol", "engine", "wirelog", "words"},
    "scheduler": {"protocol", "observe", "wirelog", "engine", "launcher"},
    "page": {"engine", "wirelog", "words"},
    "live": {"engine", "protocol", "wirelog", "words", "page"},
    "chaos": {"engine", "scheduler", "judge", "observe", "protocol", "launcher"},
    "testing": {"engine", "chaos", "judge"},
    "conform": {"engine", "scheduler", "observe", "wirelog", "words", "judge", "protocol", "launcher",
                "chaos", "testing"},
    "cli": {"protocol", "rank", "observe", "wirelog", "words", "judge", "page", "live", "scheduler", "engine",
            "launcher", "notes", "chaos", "testing", "conform", "top"},  # top: the package's __version__
    "top": {"scheduler", "protocol", "engine", "testing"},   # __init__.py: lazy names for the library
}


def part_of_module(module: str) -> str | None:
    """`inferris_dist.scheduler.group` -> scheduler; `inferris_dist.engine.x` -> engine."""
    names = module.split(".")
    if names[0] != "inferris_dist":
        return None
    return names[1] if len(names) > 1 else "top"


def modules() -> dict[str, tuple[str, Path]]:
    """Every module of ours: dotted name -> (part, file)."""
    out = {}
    for folder, prefix in ((REPO / "engine", "inferris_dist.engine"),
                           (REPO / "launcher", "inferris_dist.launcher"),
                           (REPO / "inferris_dist", "inferris_dist")):
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([prefix, *parts])
            out[name] = (part_of_module(name), path)
    return out


def imports_of(name: str, path: Path) -> set[str]:
    """The absolute names a module imports (relative imports resolved against its package)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names}   # `from pkg import module`
    return found


def test_every_part_imports_only_what_it_may():
    ours = modules()
    assert {part for part, _ in ours.values()} >= set(PARTS) - {"top"}, "a part is missing"
    wrong = []
    for name, (part, path) in ours.items():
        for target in imports_of(name, path):
            top = target.split(".")[0]
            if top in ("engine", "launcher"):
                wrong.append(f"{name} imports {target}: the installed name is inferris_dist.{target}")
            elif top == "inferris_dist":
                other = part_of_module(target)
                if other != part and other not in PARTS[part] and target in ours or (
                        other != part and other not in PARTS[part] and other in PARTS):
                    wrong.append(f"{name} ({part}) imports {target} ({other})")
            elif part == "engine" and top not in STDLIB:
                wrong.append(f"{name} imports {target}: the engine uses the standard library only")
            elif part not in ("engine",) and top not in STDLIB | THIRD_PARTY | {"__future__"}:
                wrong.append(f"{name} imports {target}: not a dependency of ours")
    assert not wrong, "\n".join(wrong)


def test_the_rule_finds_an_arrow_running_back_up(tmp_path, monkeypatch):
    """The check can fail: a rank module importing the scheduler is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("from inferris_dist.scheduler.group import ProcessGroup\n")
    found = imports_of("inferris_dist.rank.bad", bad)
    assert "inferris_dist.scheduler.group" in found
    assert part_of_module("inferris_dist.scheduler.group") not in PARTS["rank"]


CONTROL_PLANE = {"inferris_dist.engine.step", "inferris_dist.engine.scheduler",
                 "inferris_dist.engine.residency", "inferris_dist.engine.caching",
                 "inferris_dist.engine.prefix", "inferris_dist.engine.pool",
                 "inferris_dist.engine.workload", "inferris_dist.engine.speculation",
                 "inferris_dist.engine.boundary"}


def test_a_missing_lazy_name_is_said_of_the_module_by_its_import_name():
    """A package of ours that exports names lazily (a module `__getattr__`) names itself as it
    is imported (`inferris_dist.engine`, not the folder `engine` it lives in) when a name is
    missing, as Python does for any module."""
    lazy = [name for name, (_, path) in modules().items() if "\ndef __getattr__(" in path.read_text()]
    assert {"inferris_dist", "inferris_dist.engine"} <= set(lazy), lazy
    for name in lazy:
        module = importlib.import_module(name)
        with pytest.raises(AttributeError) as info:
            module.no_such_name_here
        assert str(info.value) == f"module {name!r} has no attribute 'no_such_name_here'"


def test_a_fresh_worker_loads_only_what_a_rank_needs():
    probe = ("import json, sys\n"
             "import inferris_dist.rank.cli\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'inferris_dist')))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert {"inferris_dist.engine.rank", "inferris_dist.engine.shard", "inferris_dist.engine.messages",
            "inferris_dist.protocol.wire"} <= loaded
    sides = {part_of_module(m) for m in loaded} - {"top"}
    assert sides <= {"rank", "protocol", "engine"}, f"a worker loads {sorted(sides)}"
    assert not loaded & CONTROL_PLANE, f"a worker loads the control plane: {sorted(loaded & CONTROL_PLANE)}"
    assert not any(m.startswith("asyncio") for m in json.loads(subprocess.run(
        [sys.executable, "-c",
         "import json, sys, inferris_dist.rank.worker; print(json.dumps(list(sys.modules)))"],
        capture_output=True, text=True, timeout=30, cwd=REPO).stdout))


# What `run` (the engine in this process) has no use for: the page, inspect's log reader, the
# control plane on processes, the wire and its libraries; and dataclasses, which cost 11 ms to load
# (inspect most of it) and a millisecond a class.
NOT_FOR_RUN = ("inferris_dist.page", "inferris_dist.wirelog.logread", "inferris_dist.wirelog.schema",
               "inferris_dist.scheduler", "inferris_dist.launcher", "inferris_dist.protocol.wire",
               "zmq", "msgpack", "dataclasses", "inspect")
# What a launch has no use for: the page, inspect's log reader and the wire log's schema (unless
# it is served or checked), the testing library, dataclasses.
NOT_FOR_LAUNCH = ("inferris_dist.page", "inferris_dist.wirelog.logread",
                  "inferris_dist.wirelog.schema", "inferris_dist.testing", "dataclasses", "inspect")


def loaded_by_command(argv: list[str]) -> tuple[int, set[str], str]:
    """(exit status, sys.modules afterwards, stdout) of `inferris-dist ARGV` in a fresh python."""
    probe = ("import json, sys\n"
             "from inferris_dist.cli.main import main\n"
             "try:\n"
             f"    status = main({argv!r})\n"
             "except SystemExit as e:\n"
             "    status = e.code\n"
             "sys.stdout.write('\\n' + json.dumps([status, sorted(sys.modules)]) + '\\n')\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    *printed, last = done.stdout.rstrip("\n").split("\n")
    status, names = json.loads(last)
    return status, set(names), "\n".join(printed)


def unwanted(loaded: set[str], names) -> list[str]:
    return sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in names))


@pytest.mark.parametrize("argv", [["run", "--json"], ["run"]])
def test_run_loads_only_the_engine_and_its_output(argv):
    status, loaded, printed = loaded_by_command(argv)
    assert status == 0 and printed.strip(), printed[-300:]
    assert "inferris_dist.engine.step" in loaded
    assert not unwanted(loaded, NOT_FOR_RUN), f"`{' '.join(argv)}` loads {unwanted(loaded, NOT_FOR_RUN)}"


@pytest.mark.parametrize("argv", [["launch", "--json", "--world-size", "2"], ["launch", "--world-size", "2"]])
def test_launch_loads_only_the_engine_the_control_plane_and_its_output(argv):
    status, loaded, printed = loaded_by_command(argv)
    assert status == 0 and printed.strip(), printed[-300:]
    assert {"inferris_dist.scheduler.group", "zmq"} <= loaded
    extra = unwanted(loaded, NOT_FOR_LAUNCH)
    assert not extra, f"`{' '.join(argv)}` loads {extra}"


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_version_and_help_load_no_engine(argv):
    """Saying the version or the commands builds the parser and nothing it does not need: no step
    of the engine, no workload, no metrics."""
    status, loaded, printed = loaded_by_command(argv)
    assert status == 0 and "inferris-dist" in printed
    extra = unwanted(loaded, NOT_FOR_RUN + tuple(CONTROL_PLANE) + ("inferris_dist.observe.metrics",
                                                                   "inferris_dist.cli.mechanisms"))
    assert not extra, f"`inferris-dist {' '.join(argv)}` loads {extra}"


# The channel's fault layers (scheduler/channel.py): made, and loaded, only when a run's faults ask
# for them; a run without faults sends and reads through the transport alone.
LINK_LAYER = ("inferris_dist.scheduler.link", "inferris_dist.scheduler.linkfaults")
ONE_SHOTS = ("inferris_dist.scheduler.oneshots",)


@pytest.mark.parametrize("faults, layers", [
    ((), ()),
    (("0:plan-dup@1",), LINK_LAYER),
    (("1:delay@1:0.01",), ONE_SHOTS),
    (("0:plan-dup@1", "1:delay@1:0.01"), LINK_LAYER + ONE_SHOTS)])
def test_a_launch_loads_the_fault_layers_its_faults_ask_for_and_no_other(faults, layers):
    argv = ["launch", "--world-size", "2", *(arg for f in faults for arg in ("--fault", f))]
    status, loaded, printed = loaded_by_command(argv)
    assert status == 0 and printed.strip(), printed[-300:]
    assert "inferris_dist.scheduler.channel" in loaded
    assert set(unwanted(loaded, LINK_LAYER + ONE_SHOTS)) == set(layers), f"`{' '.join(argv)}` loads " \
        f"{unwanted(loaded, LINK_LAYER + ONE_SHOTS)}"


@pytest.mark.parametrize("faults", [(), ("0:result-lost@1",), ("1:garble@1",)])
def test_a_process_group_holds_the_fault_layers_its_faults_ask_for_and_no_other(faults):
    from inferris_dist.engine import load_workload
    from inferris_dist.scheduler.group import ProcessGroup
    from inferris_dist.scheduler.options import LaunchOptions
    workload = load_workload({"engine": {"max_step_tokens": 8, "page_size": 4, "num_pages": 8, "spec_len": 0,
                                         "world_size": 2},
                              "requests": [{"request_id": "a", "prompt_len": 4, "max_new_tokens": 2}]})
    group = ProcessGroup(workload, LaunchOptions(faults=list(faults)))
    try:
        channel = group.channel
        assert (channel.link is not None) == any("result-lost" in f for f in faults)
        assert (channel.oneshots is not None) == any("garble" in f for f in faults)
    finally:
        group.close()
