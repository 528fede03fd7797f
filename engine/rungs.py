"""The mechanism ladder (SPEC §6): the engine as it stands at each rung.

A rung is a set of mechanisms switched on, chosen once when the engine is
built. Each mechanism module offers its rule and, where a rung lacks it, the
simpler rule that stood before it; `Engine.__init__` asks the rung, once,
which to use. No phase asks "which rung am I?".

    rung   budget    pages  relief under pressure    cache            speculation
    00     none      no     -                        -                -
    01     none      no     -                        -                -
    02     whole     no     -                        -                -
    03     whole     yes    none (OutOfPages)        -                -
    04     chunked   yes    none (OutOfPages)        -                -
    05     chunked   yes    preempt                  -                -
    08a    chunked   yes    preempt (cache kept)     publish          -
    08b    chunked   yes    preempt (cache kept)     publish, reuse   -
    08c    chunked   yes    evict, then preempt      publish, reuse   -

Before 08c nothing reclaims a cached page: a pool full of unreferenced cache
pages with no victim left is OutOfPages. 08c's eviction is what makes the
cache safe to keep.
    full   chunked   yes    evict, then preempt      publish, reuse   drafts

Beyond the original design:
    overlap  as full, with step k+1 planned while step k executes (engine/overlap.py)
"""
from __future__ import annotations

from typing import NamedTuple

from .errors import WorkloadError

BASE_FIELDS = ("step", "admitted", "scheduled", "executed", "sampled", "finished")
PREEMPT_FIELDS = BASE_FIELDS + ("preempted",)
CACHE_FIELDS = PREEMPT_FIELDS + ("reused", "published", "evicted")
ALL_FIELDS = CACHE_FIELDS + ("drafted", "accepted", "rolled_back")
OVERLAP_FIELDS = ALL_FIELDS + ("discarded", "returned")


class Rung(NamedTuple):
    name: str
    adds: str                        # what this rung adds, in a few words
    budget: str                      # "none": all it owes; "whole": all or nothing; "chunked"
    paged: bool                      # pages back the positions computed
    reliefs: tuple[str, ...]         # what phase 5 does when pages are short, in order
    publish: bool                    # phase 11: complete prompt blocks go to the cache
    reuse: bool                      # phase 2: a cold request starts at its cached prefix
    speculation: bool                # phase 3: decoding requests draft spec_len tokens
    fields: tuple[str, ...]          # the trace fields this rung has, in SPEC §4 order
    overlap: bool = False            # step k+1 planned while step k executes (mechanism 13)
    beyond: bool = False             # a mechanism beyond the original design

    @property
    def never_fits(self) -> bool:
        """All-or-nothing budgets can starve a request forever: such a step ends the run."""
        return self.budget == "whole"


_CHUNKED = dict(budget="chunked", paged=True)
_CACHE = dict(_CHUNKED, publish=True, fields=CACHE_FIELDS)
_OFF = dict(reliefs=(), publish=False, reuse=False, speculation=False)

RUNGS: dict[str, Rung] = {r.name: r for r in (
    Rung("00", "the engine loop", budget="none", paged=False, **_OFF, fields=BASE_FIELDS),
    Rung("01", "continuous batching", budget="none", paged=False, **_OFF, fields=BASE_FIELDS),
    Rung("02", "token budget", budget="whole", paged=False, **_OFF, fields=BASE_FIELDS),
    Rung("03", "paged state", budget="whole", paged=True, **_OFF, fields=BASE_FIELDS),
    Rung("04", "chunked prefill", **_CHUNKED, **_OFF, fields=BASE_FIELDS),
    Rung("05", "preemption", budget="chunked", paged=True, reliefs=("preempt",),
         publish=False, reuse=False, speculation=False, fields=PREEMPT_FIELDS),
    Rung("08a", "prefix cache: publish", **_CACHE, reliefs=("preempt",), reuse=False, speculation=False),
    Rung("08b", "prefix cache: reuse", **_CACHE, reliefs=("preempt",), reuse=True, speculation=False),
    Rung("08c", "cache-aware pressure", **_CACHE, reliefs=("evict", "preempt"), reuse=True,
         speculation=False),
    Rung("full", "speculation, boundary, ranks", budget="chunked", paged=True,
         reliefs=("evict", "preempt"), publish=True, reuse=True, speculation=True, fields=ALL_FIELDS),
    Rung("overlap", "overlap scheduling", budget="chunked", paged=True,
         reliefs=("evict", "preempt"), publish=True, reuse=True, speculation=True,
         fields=OVERLAP_FIELDS, overlap=True, beyond=True),
)}
NAMES = tuple(RUNGS)


def rung(name: "str | Rung") -> Rung:
    """The rung called `name` (bad input names the rungs there are)."""
    if isinstance(name, Rung):
        return name
    try:
        return RUNGS[name]
    except (KeyError, TypeError):
        raise WorkloadError(f"unknown rung {name!r}; rungs: {', '.join(NAMES)}") from None
