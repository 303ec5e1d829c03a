"""Durable wheelhouse storage: a size cap with least-recently-used eviction, hashes enforced at install.

Real pip, offline: tiny hand-made wheels behind --no-index --find-links.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distci.errors import ConfigError
from distci.provision.wheelhouse import ensure_wheelhouse, install_args, verify
from distci.provision.lru import LAST_USED, entries, evict, max_bytes, tree_size
from test_wheelhouse_envs import write_wheel

HOUR = 3600.0


@pytest.fixture
def links(tmp_path: Path) -> Path:
    directory = tmp_path / "links"
    directory.mkdir()
    for name in ("alpha", "beta", "gamma"):
        write_wheel(directory, name, "1.0")
    return directory


def build(root: Path, links: Path, name: str, **kwargs):
    return ensure_wheelhouse([name], ["--no-index", "--find-links", str(links)], root, log=lambda m: None, **kwargs)


def age(path: Path, seconds: float) -> None:
    stamp = path / LAST_USED
    then = time.time() - seconds
    os.utime(stamp, (then, then))


def test_least_recently_used_goes_first_and_fresh_ones_stay(tmp_path: Path, links: Path) -> None:
    root = tmp_path / "wh"
    alpha, beta, gamma = (build(root, links, n) for n in ("alpha", "beta", "gamma"))
    age(alpha.path, 3 * HOUR)
    age(beta.path, 2 * HOUR)
    age(gamma.path, 1 * HOUR)
    one = tree_size(gamma.path)
    assert [e.path for e in entries(root)] == [alpha.path, beta.path, gamma.path]

    messages: list[str] = []
    evicted = evict(root, cap=int(2.5 * one), log=messages.append)
    assert evicted == [alpha.path] and not alpha.path.exists()
    assert beta.path.is_dir() and gamma.path.is_dir()
    assert len(messages) == 1 and messages[0].startswith(f"wheelhouse {alpha.key}: evicted (")

    # Used a moment ago: never deleted, even over the cap; the log says the cap is exceeded.
    age(beta.path, 1.0)
    age(gamma.path, 2.0)
    messages.clear()
    assert evict(root, cap=1, log=messages.append) == []
    assert "over the" in messages[-1] and "in use" in messages[-1]


@pytest.mark.slow
def test_using_a_wheelhouse_refreshes_it_and_the_cap_applies_after_each_use(
        tmp_path: Path, links: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTCI_WHEELHOUSE_MAX_GB", raising=False)
    root = tmp_path / "wh"
    alpha = build(root, links, "alpha")
    beta = build(root, links, "beta")
    age(alpha.path, 2 * HOUR)
    age(beta.path, 1 * HOUR)
    build(root, links, "alpha")  # a reuse stamps alpha: beta is now the least recently used
    assert [e.path for e in entries(root)] == [beta.path, alpha.path]
    age(alpha.path, 1 * HOUR)  # both idle long enough to be evictable, in the same order
    age(beta.path, 2 * HOUR)

    cap_gb = 2.5 * tree_size(alpha.path) / 1e9
    gamma = build(root, links, "gamma", max_gb=cap_gb)
    assert gamma.path.is_dir() and alpha.path.is_dir() and not beta.path.exists()
    # An evicted wheelhouse is rebuilt on its next use, from the same inputs.
    again = build(root, links, "beta", max_gb=cap_gb)
    assert again.path == beta.path and verify(again) == []


def test_a_wheelhouse_being_built_is_never_evicted(tmp_path: Path, links: Path) -> None:
    root = tmp_path / "wh"
    alpha = build(root, links, "alpha")
    age(alpha.path, 5 * HOUR)
    with (root / f".{alpha.key}.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert evict(root, cap=1, log=lambda m: None) == []
    assert alpha.path.is_dir()
    assert evict(root, cap=1, log=lambda m: None) == [alpha.path]


def test_cap_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTCI_WHEELHOUSE_MAX_GB", raising=False)
    assert max_bytes() is None
    monkeypatch.setenv("DISTCI_WHEELHOUSE_MAX_GB", "1.5")
    assert max_bytes() == 1_500_000_000
    monkeypatch.setenv("DISTCI_WHEELHOUSE_MAX_GB", "lots")
    with pytest.raises(ConfigError, match="DISTCI_WHEELHOUSE_MAX_GB='lots' is not a number"):
        max_bytes()


def test_hashes_recorded_at_download_are_enforced_at_install(tmp_path: Path, links: Path) -> None:
    wheelhouse = build(tmp_path / "wh", links, "alpha")
    args = install_args(wheelhouse)
    assert "--require-hashes" in args and "--no-index" in args

    def install(target: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
                               "--target", str(target), *args], capture_output=True, text=True)

    assert install(tmp_path / "ok").returncode == 0
    assert (tmp_path / "ok" / "alpha" / "__init__.py").is_file()

    wheel = wheelhouse.path / wheelhouse.wheels[0]
    wheel.write_bytes(wheel.read_bytes() + b"tampered")
    assert verify(wheelhouse) == [wheel.name]
    bad = install(tmp_path / "bad")
    assert bad.returncode != 0 and "DO NOT MATCH THE HASHES" in bad.stdout + bad.stderr
    assert not (tmp_path / "bad" / "alpha").exists()
