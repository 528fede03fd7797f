"""A Hypothesis strategy of fault schedules, for property tests of the chaos tools (Hypothesis is
a test dependency: the library draws its schedules with `random`, inferris_dist.chaos.schedules).
"""
from __future__ import annotations

from typing import Sequence

from hypothesis import strategies as st

from inferris_dist.chaos.schedules import fault_kinds


def fault_schedules(world_size: int, steps: int, kinds: Sequence[str] | None = None, max_faults: int = 3,
                    step_timeout: float = 0.25):
    """Tuples of distinct fault specs on `world_size` ranks over `steps` steps, with the kinds
    read from the fault grammar; Hypothesis shrinks them toward fewer faults, the first kind,
    rank 0 and step 0."""
    infos = fault_kinds()
    names = [k for k in (kinds or infos) if k in infos]

    @st.composite
    def one(draw):
        kind = draw(st.sampled_from(names))
        rank = draw(st.one_of(st.integers(0, world_size - 1).map(str), st.just("all")))
        step = draw(st.integers(0, max(0, steps - 1)))
        repeat = draw(st.sampled_from(("", "+")))
        arg = ""
        if infos[kind].arg == "seconds":
            arg = ":" + f"{draw(st.sampled_from((0.02, round(step_timeout * 1.5 + 0.05, 3)))):g}"
        elif infos[kind].arg == "count":
            arg = f":{draw(st.integers(1, 2))}"
        return f"{rank}:{kind}@{step}{repeat}{arg}"

    return st.lists(one(), min_size=1, max_size=max_faults, unique=True).map(tuple)
