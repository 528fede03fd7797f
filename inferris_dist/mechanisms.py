"""The mechanisms of the engine, the question each answers, and where each lives."""

MECHANISMS = [
    ("continuous batching", "Who joins and leaves the running batch this step?",
     "engine/scheduler.py", "tests/test_scheduler.py"),
    ("token budget", "How many tokens does each request get this step?",
     "engine/scheduler.py", "tests/test_scheduler.py"),
    ("chunked prefill", "How is a prompt longer than the budget split across steps?",
     "engine/scheduler.py", "tests/test_scheduler.py"),
    ("paged state", "Which page and slot hold position p of a request?",
     "engine/pool.py", "tests/test_pool.py"),
    ("preemption", "Who gives its pages back when the pool is short?",
     "engine/residency.py", "tests/test_residency.py"),
    ("prefix keys + radix cache", "Which prompt blocks has someone computed already?",
     "engine/prefix.py", "tests/test_prefix.py"),
    ("cache-aware scheduling", "What is reused, published to the cache, evicted from it?",
     "engine/caching.py", "tests/test_caching.py"),
    ("speculative decoding", "How many draft tokens survive, and what rolls back?",
     "engine/speculation.py", "tests/test_speculation.py"),
    ("executor boundary", "What does the control plane check before it commits?",
     "engine/boundary.py", "tests/test_boundary.py"),
    ("rank groups", "When do N rank answers make one?",
     "engine/group.py", "tests/test_group.py"),
]
