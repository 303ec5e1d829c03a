"""distci's distributed suites: pytest files that run inside cell environments.

A package (not loose test files) so every module is importable by one stable name,
`suites.<room>.<module>`: pytest's default import mode puts the directory above `suites/`
on sys.path, in the repo and wherever a cell environment or image copies the folder, and
the rank workers import scenario dataclasses and test functions by that same name.

Rooms, lowest first (each imports only the rooms before it; tests/test_architecture.py):
`scenario/` what a row is (torch-free), `runner/` what a rank executes and the reference,
`judges/` whether a run is right, `probes/` what the stack can do, `generators/` the
fuzzer's cell side. The pytest files (test_*.py, conftest.py, fuzz_entry.py,
regressions/) stay at the top: their paths are the test ids results are stored under.

Vocabulary (the words code, ids and docs use here, as torchtitan's parallel_dims.py
writes down "axis" and "dim"):

- **scenario**: one whole training configuration, a `Scenario` record (scenario/record.py):
  one value per column.
- **row**: a scenario in the table (`TABLE`, scenario/table.py) with its tier; its id is
  the pytest id (`test_scenario[fsdp-eager-mp_bf16-ga2]`).
- **column**: one field of the Scenario declared once in `COLUMNS` (values, default, id
  fragment, doc); `RULES` say which combinations are meaningless.
- **step**: one optimizer update over one global batch, all its microbatches; an int
  `step` is its index. `runner/step.py` holds the step's pieces users configure (loss,
  clipping, optimizer, schedule, loss scaling) and `StepParts`, what every step of a run
  shares; `pipeline.forward_backward` is one schedule run inside a step.
- **microbatch**: a data-parallel rank's slice of the global batch, accumulated (`accum`).
- **rank**: one process of the world; a dp rank is its index on the data-parallel axis.
- **mesh**: a DeviceMesh; an **axis** is one of its dimensions (dp_shard, dp_replicate, tp,
  pp, ep, cp); a **dim** is a tensor dimension (Shard(dim)).
- **layout**: how one row's model sits on its meshes (runner/layout.py `Layout`: the wrapped
  model, its groups, its sync and pipeline); a **plan** is the TP plan (`models.tp_plan`).
- **reference**: the single-process run a parallel run is judged against (runner/reference.py).
- **evidence**: what a run recorded besides its numbers: graphs, collectives and their
  dtypes, kernels, placements (runner/evidence.py `Evidence`); the numbers are a `TrainRecord`.
- **judge**: a check of a run against its reference or the graph its row expects; it fails
  with a message naming what differs (judges/).
"""
