"""The scenario room: what a row of the table is, before anything runs.

`columns` declares the columns and RULES, `record` the Scenario record built from them,
`rows` the training step's crossings, `table` the table itself (data). Importable without
torch (tools/coverage.py and the fuzzer's controller read it), so nothing here imports the
runner or the judges at module level.
"""
