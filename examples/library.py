"""Using inferris-dist as a library: the same workload in one process and on
four worker processes, step by step, and a check that nothing changed.

    .venv/bin/python examples/library.py     # after `make demo` or `make test`

It imports inferris_dist as installed (`pip install -e .` in the venv): in a checkout the
engine lives in engine/, which the package installs as inferris_dist.engine.
"""
import inferris_dist
from inferris_dist.engine import Engine, load_workload

WORKLOAD = {
    "engine": {"max_step_tokens": 12, "page_size": 4, "num_pages": 12, "spec_len": 2},
    "requests": [
        # two requests share a 8-token system prompt: the second reuses its cached pages
        {"request_id": "a", "tokens": [7, 7, 7, 7, 8, 8, 8, 8, 1, 2, 3], "max_new_tokens": 6,
         "accept_script": [2, 0, 1]},
        {"request_id": "b", "tokens": [7, 7, 7, 7, 8, 8, 8, 8, 4, 5], "max_new_tokens": 4,
         "arrival_step": 2},
        {"request_id": "c", "prompt_len": 20, "max_new_tokens": 3, "eos_after": 1},
    ],
}


def main() -> None:
    workload = load_workload(WORKLOAD)

    engine = Engine(workload)                      # in process: LocalGroup of world_size ranks
    local = [trace.to_json() for trace in engine.run()]
    print(f"in process: {len(local)} steps; summary {engine.summary()}")

    with inferris_dist.launch(workload, world_size=4) as remote:
        for trace in remote.run():
            wire = remote.group.last_record
            rtts = ", ".join(f"{t * 1000:.2f}" for t in wire.rtt.values())
            print(f"step {trace.step}: executed {trace.executed} | plan {wire.plan_bytes} B, "
                  f"rtt ms [{rtts}], {wire.verdict}")
            assert trace.to_json() == local[trace.step], "the processes changed the trace"
        print(f"on 4 processes: identical; worker pids {remote.group.pids_started}")


if __name__ == "__main__":
    main()
