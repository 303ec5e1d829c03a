"""The scenario room: what a row of the table is, before anything runs.

`columns` declares the columns and RULES, `record` the Scenario record built from them
(with `model_args`, the model's sizes), `rows` the training step's crossings, `table` the
table itself (data), `devices` which hardware a row needs and the dtype each accelerator
trains in. Importable without torch (tools/coverage.py and the fuzzer's controller read
it): the lowest room, it imports no other.
"""
