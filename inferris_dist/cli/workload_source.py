"""Where a command's workload comes from: --spec, --request flags, or the built-in demo."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from inferris_dist.engine import WorkloadError
from inferris_dist.protocol.faults import KINDS

if TYPE_CHECKING:
    from inferris_dist.engine import Workload

# The built-in demo: three requests, chunked prefill, a prefix, speculation on four ranks.
DEMO = {
    "engine": {"max_step_tokens": 8, "page_size": 4, "num_pages": 8, "spec_len": 3, "world_size": 4},
    "requests": [
        {"request_id": "r0", "prompt_len": 6, "max_new_tokens": 4},
        {"request_id": "r1", "prompt_len": 4, "max_new_tokens": 3, "arrival_step": 1},
        {"request_id": "r2", "prompt_len": 10, "max_new_tokens": 5, "arrival_step": 2,
         "accept_script": [1, 2]},
    ],
}

# The ladder's demo: a shared 12-token system prompt (three chats and a late fourth), a
# 30-token document that outgrows a 16-token budget, a pool of 12 pages that cannot hold it
# all, and accept scripts. Each rung's mechanism changes the outcome: the budget starves the
# document (NeverFits), pages run out without preemption, the cache fills the pool until
# eviction reclaims it, reuse skips the shared prompt, speculation saves steps.
_SYSTEM = list(range(100, 112))
LADDER_DEMO = {
    "engine": {"max_step_tokens": 16, "page_size": 4, "num_pages": 12, "spec_len": 3},
    "requests": [
        {"request_id": "chat-a", "tokens": _SYSTEM + [1, 2, 3], "max_new_tokens": 6,
         "accept_script": [3, 2, 3]},
        {"request_id": "chat-b", "tokens": _SYSTEM + [4, 5], "max_new_tokens": 6, "arrival_step": 1,
         "accept_script": [2, 3, 1]},
        {"request_id": "chat-c", "tokens": _SYSTEM + [6, 7, 8, 9], "max_new_tokens": 6,
         "arrival_step": 2, "accept_script": [3, 3]},
        {"request_id": "doc", "tokens": list(range(500, 530)), "max_new_tokens": 4, "arrival_step": 3,
         "accept_script": [1]},
        {"request_id": "chat-d", "tokens": _SYSTEM + [10], "max_new_tokens": 6, "arrival_step": 5,
         "accept_script": [3, 1, 2]},
    ],
}

WORKLOAD_HELP = """\
the workload (--spec FILE, JSON; every value an integer unless said):
  {"engine": {"max_step_tokens": 8, "page_size": 4, "num_pages": 8, "spec_len": 0, "world_size": 1},
   "requests": [{"request_id": "a", "prompt_len": 6, "max_new_tokens": 4},
                {"request_id": "b", "tokens": [1, 2, 3], "max_new_tokens": 2, "arrival_step": 1,
                 "eos_after": 1, "accept_script": [2, 0]}],
   "faults": ["1:crash@3"]}
engine keys (all optional; the defaults shown above):
  max_step_tokens >= 1  tokens one step may compute (the budget)
  page_size >= 1        slots per page
  num_pages >= 1        pages in the pool
  spec_len >= 0         draft tokens a decoding request proposes per step
  world_size 1..256     ranks (launch: worker processes)
request keys:
  request_id            a unique, non-empty string (required)
  tokens | prompt_len   the prompt: a list of integers, or its length (exactly one of the two)
  max_new_tokens >= 1   tokens to generate (required)
  arrival_step >= 0     the step it arrives at (default 0)
  eos_after >= 0|null   sample EOS once this many tokens were generated (default null: never)
  accept_script         list of integers or null: draft tokens accepted at each verdict,
                        clamped to 0..drafted (default null: all accepted)
faults (launch only; run notes them): RANK:KIND@STEP[+][:ARG], RANK a number or all;
  kinds: """ + ", ".join(KINDS) + """
"""

REQUEST_FORMAT = "ID:PROMPT_LEN:MAX_NEW[:ARRIVAL[:EOS_AFTER]]"


def parse_request_flag(text: str) -> dict:
    """`--request r0:6:4:0:2` -> a SPEC §1 request object (validated with the rest)."""
    parts = text.split(":")
    if not 3 <= len(parts) <= 5 or not parts[0]:
        raise WorkloadError(f"--request {text!r}: want {REQUEST_FORMAT}")
    names = ("prompt_len", "max_new_tokens", "arrival_step", "eos_after")
    out: dict = {"request_id": parts[0]}
    for name, value in zip(names, parts[1:]):
        try:
            out[name] = int(value)
        except ValueError:
            raise WorkloadError(f"--request {text!r}: {name} must be an integer, got {value!r}") from None
    return out


def workload_from_flags(spec: str | None, requests: list[str] | None, knobs: dict,
                        default: dict | None = DEMO, default_name: str = "demo") -> tuple[Workload, str]:
    """The workload and a name for it; knobs (command-line engine values) override the spec's."""
    from inferris_dist.engine.workload import load_workload, parse_json, read_text
    if spec is not None and requests:
        raise WorkloadError("--spec and --request are exclusive: give one or the other")
    if spec == "-":
        workload, name = load_workload(parse_json(read_text("-", "spec"), "spec on stdin")), "stdin"
    elif spec is not None:
        workload, name = load_workload(Path(spec)), Path(spec).name.removesuffix(".json")
    elif requests:
        workload = load_workload({"requests": [parse_request_flag(r) for r in requests]})
        name = "requests"
    else:
        workload, name = load_workload(default), default_name
    return workload.with_config(**knobs), name
