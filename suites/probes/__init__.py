"""The probes room: what this stack can do, asked, never read off a version (`capabilities`).

A row runs or skips by what the probes answer (suites/conftest.py).
"""
