"""/metrics: the run's numbers in the Prometheus text format.

The format and its escaping are done by `prometheus_client` (a maintained library: the
exposition's rules for names, label values, HELP text, histograms and counters' `_total`
are its, not re-implemented here). One custom collector reads the live state (state.py)
when a scrape comes: nothing is counted in the run's hot path, every number is what the
wire log says.

FAMILIES is every family served: (name as exposed, type, labels, meaning). The docs'
table (docs/observing.md, "Watching a run live") lists the same, checked by a test.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest

from inferris_dist.live.state import Histogram, LiveState

__all__ = ["CONTENT_TYPE_LATEST", "FAMILIES", "exposition"]

# The text format, version 0.0.4 (what every Prometheus server reads; newer clients also
# label their output 1.0.0, the same bytes for names of plain ASCII as these are).
CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"

# name (as the text format shows it), type, labels, meaning
FAMILIES: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("inferris_num_requests_running", "gauge", (), "requests that ran in the last committed step and did "
     "not finish in it"),
    ("inferris_num_requests_waiting", "gauge", (), "requests in flight that did not run in the last "
     "committed step"),
    ("inferris_num_preemptions_total", "counter", (), "preemptions (a request preempted twice counts twice)"),
    ("inferris_kv_pages_used", "gauge", (), "KV pages some request's page table maps, after the last step"),
    ("inferris_kv_pages_free", "gauge", (), "KV pages on the free list, after the last step"),
    ("inferris_kv_pages_cached", "gauge", (), "KV pages the prefix cache holds that no request maps "
     "(reusable, reclaimed by eviction)"),
    ("inferris_kv_cache_usage_perc", "gauge", (), "KV cache usage as a fraction, 0 to 1: pages used / "
     "num_pages (cached pages count as free, as they can be reclaimed)"),
    ("inferris_prefix_cache_queries_total", "counter", (), "prompt tokens looked up in the prefix cache "
     "(0 at rungs without prefix reuse)"),
    ("inferris_prefix_cache_hits_total", "counter", (), "prompt tokens served from the prefix cache"),
    ("inferris_prompt_tokens_total", "counter", (), "prompt tokens of the requests admitted, counted "
     "again at each preemption (as --metrics' prompt_tokens)"),
    ("inferris_generation_tokens_total", "counter", (), "tokens generated (sampled, and drafts accepted)"),
    ("inferris_spec_decode_num_draft_tokens_total", "counter", (), "draft tokens verified"),
    ("inferris_spec_decode_num_accepted_tokens_total", "counter", (), "draft tokens accepted"),
    ("inferris_request_success_total", "counter", ("finished_reason",), "requests finished, by reason "
     "(LENGTH, EOS)"),
    ("inferris_steps_committed_total", "counter", (), "steps committed (idle steps included: the "
     "trace's line count)"),
    ("inferris_attempts_failed_total", "counter", (), "attempts at a step that failed (a loss, a "
     "refused join), not counting plans sent ahead and voided"),
    ("inferris_epoch", "gauge", (), "the group's epoch (moves each time a member is replaced)"),
    ("inferris_world_size_effective", "gauge", (), "ranks in the world now (the run's world size, then "
     "each resize's)"),
    ("inferris_world_size_requested", "gauge", (), "ranks the run asked for (--world-size)"),
    ("inferris_step_duration_seconds", "histogram", (), "seconds from a step's first phase to its "
     "commit (a recovery in between included)"),
    ("inferris_time_to_first_token_seconds", "histogram", (), "seconds from the start of the step "
     "that admitted a request to the commit of the step that sampled its first token"),
    ("inferris_time_to_first_token_steps", "histogram", (), "steps from a request's admission to "
     "its first token"),
    ("inferris_inter_token_latency_seconds", "histogram", (), "seconds between the commits of two "
     "steps that gave a request tokens, one observation per such step after the first"),
    ("inferris_inter_token_latency_steps", "histogram", (), "steps between two steps that gave a "
     "request tokens"),
    ("inferris_rank_round_trip_seconds", "histogram", ("rank",), "a plan's round trip to a rank and "
     "back, per result taken"),
    ("inferris_rank_sent_bytes_total", "counter", ("rank",), "bytes sent to a rank, header and body "
     "(as the rank table counts them)"),
    ("inferris_rank_received_bytes_total", "counter", ("rank",), "bytes of the replies taken from a "
     "rank, header and body"),
    ("inferris_rank_replies_dropped_total", "counter", ("rank",), "a rank's replies dropped (stale, "
     "duplicate, future, void)"),
    ("inferris_rank_restarts_total", "counter", ("rank",), "times a rank's member was replaced"),
    ("inferris_rank_losses_total", "counter", ("rank", "reason"), "losses of a rank, by reason (died, "
     "hung, protocol, ...)"),
    ("inferris_rank_join_wait_seconds", "histogram", ("rank",), "per joined step, how long a rank's "
     "result waited at the join for the last one to arrive (0 for the last)"),
    ("inferris_rank_last_arrivals_total", "counter", ("rank",), "joined steps at which a rank's result "
     "arrived last, the one the join waited for (a world of one rank has no last)"),
)
_MEANING = {name: (kind, labels, meaning) for name, kind, labels, meaning in FAMILIES}


def _family(name: str):
    kind, labels, meaning = _MEANING[name]
    if kind == "counter":
        return CounterMetricFamily(name[:-len("_total")], meaning, labels=list(labels))
    if kind == "gauge":
        return GaugeMetricFamily(name, meaning, labels=list(labels))
    return HistogramMetricFamily(name, meaning, labels=list(labels))


def _one(name: str, value: float):
    f = _family(name)
    f.add_metric([], value)
    return f


def _hist(f, labels: list[str], h: Histogram) -> None:
    f.add_metric(labels, buckets=h.cumulative(), sum_value=h.sum)


class _Collector:
    """Reads the live state at each scrape (under its lock: a consistent set of numbers)."""

    def __init__(self, state: LiveState):
        self.state = state

    def collect(self):
        with self.state.lock:
            return list(self._families())

    def _families(self):
        n = self.state.numbers
        c = n.counters
        used = c.get("pages_used", 0)
        yield _one("inferris_num_requests_running", c.get("requests_running", 0))
        yield _one("inferris_num_requests_waiting", c.get("requests_waiting", 0))
        yield _one("inferris_num_preemptions_total", n.preemptions)
        yield _one("inferris_kv_pages_used", used)
        yield _one("inferris_kv_pages_free", c.get("pages_free", n.num_pages if not c else 0))
        yield _one("inferris_kv_pages_cached", c.get("pages_cached", 0))
        yield _one("inferris_kv_cache_usage_perc", used / n.num_pages if n.num_pages else 0.0)
        yield _one("inferris_prefix_cache_queries_total", n.prefix_queried)
        yield _one("inferris_prefix_cache_hits_total", n.prefix_hits)
        yield _one("inferris_prompt_tokens_total", n.prompt_tokens)
        yield _one("inferris_generation_tokens_total", n.generation_tokens)
        yield _one("inferris_spec_decode_num_draft_tokens_total", n.drafted)
        yield _one("inferris_spec_decode_num_accepted_tokens_total", n.accepted)
        f = _family("inferris_request_success_total")
        for reason, count in sorted(n.finished.items()):
            f.add_metric([reason], count)
        yield f
        yield _one("inferris_steps_committed_total", n.steps)
        yield _one("inferris_attempts_failed_total", n.attempts_failed)
        yield _one("inferris_epoch", n.epoch)
        yield _one("inferris_world_size_effective", n.world_effective)
        yield _one("inferris_world_size_requested", n.world_requested)
        for name, h in (("inferris_step_duration_seconds", n.step_seconds),
                        ("inferris_time_to_first_token_seconds", n.ttft_seconds),
                        ("inferris_time_to_first_token_steps", n.ttft_steps),
                        ("inferris_inter_token_latency_seconds", n.itl_seconds),
                        ("inferris_inter_token_latency_steps", n.itl_steps)):
            f = _family(name)
            _hist(f, [], h)
            yield f
        ranks = sorted(n.ranks.items())
        f = _family("inferris_rank_round_trip_seconds")
        for r, x in ranks:
            _hist(f, [str(r)], x.rtt)
        yield f
        for name, value in (("inferris_rank_sent_bytes_total", lambda x: x.sent),
                            ("inferris_rank_received_bytes_total", lambda x: x.received),
                            ("inferris_rank_replies_dropped_total",
                             lambda x: max(x.dropped, x.dropped_at_end)),
                            ("inferris_rank_restarts_total", lambda x: x.restarts)):
            f = _family(name)
            for r, x in ranks:
                f.add_metric([str(r)], value(x))
            yield f
        f = _family("inferris_rank_losses_total")
        for r, x in ranks:
            for reason, count in sorted(x.losses.items()):
                f.add_metric([str(r), reason], count)
        yield f
        f = _family("inferris_rank_join_wait_seconds")
        for r, x in ranks:
            if x.join_wait.count:
                _hist(f, [str(r)], x.join_wait)
        yield f
        f = _family("inferris_rank_last_arrivals_total")
        for r, x in ranks:
            if x.join_wait.count:
                f.add_metric([str(r)], x.last_arrivals)
        yield f


def registry(state: LiveState) -> CollectorRegistry:
    """A registry of one collector, reading `state` (no process or platform collectors: the
    numbers are the run's, not the server's)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(state))
    return reg


def exposition(reg: CollectorRegistry) -> bytes:
    """The text format (version 0.0.4) of every family, as a scrape gets it."""
    return generate_latest(reg)
