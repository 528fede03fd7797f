"""Watching a run as it runs: the wire log followed as it is written (live state), served over
HTTP as the page, /metrics, /health and /status (server, prom). Reads the wire log and builds on
the page; nothing of the control plane.
"""
