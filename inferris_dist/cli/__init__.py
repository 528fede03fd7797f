"""The `inferris-dist` command line: commands, arguments, rendering for people, `inspect`,
`ladder`, `html` (its page is built in inferris_dist/page), workload sources. Nothing below imports it.
"""
