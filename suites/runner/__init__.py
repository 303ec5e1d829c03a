"""The runner room: what a rank executes for a row, and the single-process reference.

The model (`models`, `tying`, `uneven`, `routing`), its layout on the mesh (`layout`,
`parallelize` with `fsdp`, `data_parallel`, `expert_parallel`, `pipeline`, `checkpoint`),
one training step as users write it (`step`: loss, clipping, optimizer, schedule, and the
`StepParts` both runs share), the parallel run (`training`) and the reference
(`reference`), and what a run records while it runs (`evidence`, `collectives`).
Imports only the scenario room.
"""
