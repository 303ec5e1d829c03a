"""distci's pytest plugin for distributed tests, loaded by name: `pytest -p distci.harness.plugin`.

This package face imports nothing, so the controller can import `distci.harness.procs`
(or any record beside it) without pytest. plugin.py holds the hooks and the `dist`
fixture, pool.py the rank pool, outcome.py how hangs, crashes and timeouts are told apart.
"""
