"""A test that imports a torch module lazily, and says whether its fork had it already
(tests/test_warm.py: a template remembers such imports across sessions of one stack)."""

import os
import sys

import pytest

LAZY = "torch.utils.show_pickle"  # imported by no torch, torch.distributed or group join


@pytest.mark.world_size(2)
def test_imports_lazily(dist):
    with open(os.path.join(os.environ["DISTCI_CASE_OUT"], f"{os.environ['DISTCI_CASE_RUN']}-rank{dist.rank}"),
              "w") as out:
        out.write(str(LAZY in sys.modules))
    __import__(LAZY)
