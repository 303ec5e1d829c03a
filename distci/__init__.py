"""distci: a regression CI matrix for distributed PyTorch training stacks.

The package splits in two halves. The controller half (matrix, sources, wheelhouse,
envs, images, store, verdicts, dashboard, bisect, cli) runs in the nox session. The
cell half (harness, stack, results) is installed into every cell environment and must
import on torch 2.5 through today's nightly with only the standard library, pytest and
torch, so it never imports the controller half.
"""

__version__ = "0.1.0"
