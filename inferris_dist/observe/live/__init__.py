"""Watching a run as it runs."""
