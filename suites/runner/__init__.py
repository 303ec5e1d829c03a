"""The runner room: what a rank executes for a row, and the single-process reference.

The model (`models`, `model_args`, `tying`, `uneven`, `routing`), how it is laid out on the
mesh (`layout`, `parallelize` with `fsdp`, `data_parallel`, `expert_parallel`, `pipeline`,
`checkpoint`), and one training step as users write it (`step`), driven by the parallel run
(`training`) and by the reference (`reference`) through the same public names.
"""
