"""distci's pytest plugin for distributed tests: `pytest -p distci.harness`.

See plugin.py for how tests are dispatched, pool.py for the rank pool, outcome.py for
how hangs, crashes and timeouts are told apart.
"""

from distci.harness.plugin import (  # noqa: F401 - pytest finds hooks and fixtures by name here
    dist,
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_pyfunc_call,
    pytest_runtest_setup,
    pytest_unconfigure,
)
from distci.harness.context import DistContext  # noqa: F401
