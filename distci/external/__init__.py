"""External suites: upstream's own distributed tests (torchtitan, torchao) as distci Results.

    suites/external.toml -> spec.load_suites -> fetch (upstream sources at the cell's ref)
      -> adapters (cases) -> launch (torchrun | upstream runner) -> readers (outcome)
      -> runner (Results in the run directory, like native tests)

`python -m distci.external run ...` runs the declared suites; see distci/external/cli.py.
Kept import-free: modules of this package also run inside cell environments.
"""
