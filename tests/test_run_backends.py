"""`distci run --backend NAME`: the backends beyond venv are found by name in the
`distci.run_backends` entry points their own stage registers, so run/ imports no stage above
it (tests/test_architecture.py) and the CLI is unchanged."""

from __future__ import annotations

import argparse
import re
from importlib.metadata import entry_points

import pytest

from distci.errors import ConfigError
from distci.run.command import BACKENDS, add_parser, backend


def test_the_docker_backend_is_the_images_stages_found_through_distcis_metadata() -> None:
    from distci.images.run import run_cells_in_docker

    assert backend("docker") is run_cells_in_docker


def test_an_unregistered_backend_names_the_group_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"--backend podman: no such backend is registered \(entry points "
                                          r"distci.run_backends\).*reinstall distci"):
        backend("podman")


def test_the_cli_offers_venv_and_every_registered_backend() -> None:
    usage = add_parser(argparse.ArgumentParser().add_subparsers()).format_usage()
    choices = re.search(r"--backend \{([^}]*)\}", usage).group(1).split(",")
    registered = {e.name for e in entry_points(group=BACKENDS)}
    assert set(choices) == {"venv"} | registered and "docker" in registered
