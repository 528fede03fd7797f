"""What the tests share: running the CLI and the goldens (external), processes and the leftover
check (procs), the mechanism-note harness (invariants), the naive SPEC oracle (naive_reference),
network-namespace hosts (netns), a DevTools browser client (browser), and a stand-in worker for
the template (template_child)."""
