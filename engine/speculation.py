"""Speculative decoding: draft (phase 3) and resolve (phase 10).

A decoding request asks for its last sampled token plus `draft_len` draft
tokens; the ranks' verdict says how many drafts are accepted, the rest are
rolled back: the frontier steps back and the pages past it are released.
"""
from __future__ import annotations

from .pool import PagePool, pages_needed
from .request import Request


def is_decoding(req: Request) -> bool:
    """Phase 3: the frontier sits on the last sampled token (not `computed >= prompt`, SPEC §5)."""
    return req.generated >= 1 and req.computed == req.prompt + req.generated - 1


def draft_len(req: Request, spec_len: int, decoding: bool | None = None) -> int:
    """Phase 3: a decoding request asks for up to spec_len drafts, any other for none."""
    if decoding is None:
        decoding = is_decoding(req)
    return min(spec_len, req.max_new_tokens - req.generated - 1) if decoding else 0


def resolve(req: Request, num_tokens: int, accepted: int, pool: PagePool,
            reserved: int = 0) -> tuple[int, int, int]:
    """Phase 10 for one committed decode item; returns (drafted, accepted, rolled_back).
    `reserved`: positions past the frontier whose pages stay (overlap: the request's item in
    the step planned ahead runs there)."""
    drafted = num_tokens - 1
    if req.eos_after is not None:
        accepted = min(accepted, req.eos_after - req.generated)
    rolled_back = drafted - accepted
    req.computed -= rolled_back
    req.generated += accepted
    req.num_verdicts += 1
    keep = pages_needed(req.computed + reserved, pool.page_size)
    table = req.page_table
    if len(table) > keep:            # released from the last page back
        dropped = table[keep:]
        del table[keep:]
        pool.unmap_pages(reversed(dropped), req.request_id)
    req.draft_len = 0
    return drafted, accepted, rolled_back
