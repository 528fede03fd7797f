"""The `inferris-dist` command line: commands, arguments, rendering for people, `inspect`,
`ladder`, the HTML page, workload sources. Nothing below imports it.
"""
