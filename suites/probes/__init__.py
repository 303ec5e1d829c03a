"""The probes room: what this stack and device can do, asked, never read off a version.

`capabilities` probes features (Float8 kernels, FSDP2's API, pipeline schedules...),
`devices` adds the suite's columns (training dtype, hardware needs) to the harness's
device table. A row runs or skips by what these answer.
"""
