"""Wheelhouse and envs with real pip, offline: tiny hand-made wheels behind --no-index --find-links."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from distci.provision.envs import BASE_MARKER, MARKER, ensure_env, find_uv, installed_env, stack_env
from distci.errors import InfraError
from distci.provision.wheelhouse import (BUILDER_LOCK, UNMARKED_STALE_S, ensure_wheelhouse, failure_line,
                                         remove_stale_temps, wheelhouse_key)
from distci.provision.files import MANIFEST
from distci.provision.pipconfig import resolution_environment
from distci.provision.wheeltarget import interpreter_tags


def write_wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal valid pure-Python wheel: one module, METADATA, WHEEL, RECORD."""
    dist = f"{name.replace('-', '_')}-{version}"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}.dist-info/METADATA": metadata,
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: distci-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(data.encode())}\n"
        for path, data in files.items()
    )
    files[f"{dist}.dist-info/RECORD"] = record + f"{dist}.dist-info/RECORD,,\n"
    path = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(member, data)
    return path


@pytest.fixture
def links(tmp_path: Path) -> Path:
    directory = tmp_path / "links"
    directory.mkdir()
    write_wheel(directory, "tinydep", "1.0")
    write_wheel(directory, "tinyapp", "1.0", requires=("tinydep>=1.0",))
    write_wheel(directory, "tinyapp", "2.0", requires=("tinydep>=1.0",))
    return directory


def offline(links: Path) -> list[str]:
    return ["--no-index", "--find-links", str(links)]


def test_key_ignores_requirement_order_but_not_content() -> None:
    tags = {"python": "cp311", "platform": "linux-x86_64"}
    key = wheelhouse_key(["a==1", "b"], ["--pre"], tags)
    assert key == wheelhouse_key(["b", "a==1"], ["--pre"], tags)
    assert key != wheelhouse_key(["a==2", "b"], ["--pre"], tags)
    assert key != wheelhouse_key(["a==1", "b"], [], tags)
    assert key != wheelhouse_key(["a==1", "b"], ["--pre"], {**tags, "python": "cp312"})


def test_wheelhouse_locks_and_is_reused_without_pip(tmp_path: Path, links: Path) -> None:
    root = tmp_path / "wh"
    messages: list[str] = []
    first = ensure_wheelhouse(["tinyapp==1.0"], offline(links), root, log=messages.append)
    assert sorted(first.wheels) == ["tinyapp-1.0-py3-none-any.whl", "tinydep-1.0-py3-none-any.whl"]
    assert first.path == root / first.key and len(first.key) == 16
    lock = first.lock_file.read_text().splitlines()
    digest = hashlib.sha256((links / "tinydep-1.0-py3-none-any.whl").read_bytes()).hexdigest()
    assert lock == [
        f"tinyapp==1.0 --hash=sha256:{hashlib.sha256((first.path / first.wheels[0]).read_bytes()).hexdigest()}",
        f"tinydep==1.0 --hash=sha256:{digest}",
    ]
    manifest = json.loads((first.path / MANIFEST).read_text())
    assert manifest["requirements"] == ["tinyapp==1.0"] and manifest["pip_args"] == offline(links)
    assert manifest["python"] == interpreter_tags()["python"] and manifest["created_at"]
    assert any(m.startswith(f"wheelhouse {first.key}: 2 wheels") for m in messages)

    # With the find-links directory gone, any pip run would fail: reuse must not run pip.
    for wheel in links.iterdir():
        wheel.unlink()
    messages.clear()
    again = ensure_wheelhouse(["tinyapp==1.0"], offline(links), root, log=messages.append)
    assert (again.path, again.wheels) == (first.path, first.wheels)
    assert messages == [f"wheelhouse {first.key}: reusing {first.path} (2 wheels)"]


def _temp_named_by_a_dead_pid(root: Path, suffix: str) -> Path:
    """A wheelhouse temp directory under `root` named by the pid of a process that has ended."""
    root.mkdir(exist_ok=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = root / f".tmp-{dead.pid}-0123456789abcdef-{suffix}"
    path.mkdir()
    return path


def test_failed_download_leaves_no_wheelhouse(tmp_path: Path, links: Path) -> None:
    root = tmp_path / "wh"
    stale = _temp_named_by_a_dead_pid(root, "crashed")
    (stale / MANIFEST).write_text("{}")
    (stale / BUILDER_LOCK).touch()  # its builder died: nobody holds the lock
    with pytest.raises(InfraError) as err:
        ensure_wheelhouse(["tinyapp==1.0", "nosuchpkg==3.0"], offline(links), root, log=lambda m: None)
    message = str(err.value)
    assert "\n" not in message and "pip wheel failed" in message and "nosuchpkg" in message
    assert "nosuchpkg" in err.value.log
    assert not stale.exists()
    assert [p.name for p in root.iterdir() if not p.name.startswith(".")] == [
        f"{message.split()[1].rstrip(':')}.failed.log"
    ]


def test_a_build_whose_pid_is_not_ours_is_kept_while_its_lock_is_held(tmp_path: Path) -> None:
    """A builder in another PID namespace (a bisect container on the same checkout) has a
    pid this process cannot see; its directory is removed only once its lock is free."""
    root = tmp_path / "wh"
    live = _temp_named_by_a_dead_pid(root, "elsewhere")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(live / BUILDER_LOCK)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        unmarked = _temp_named_by_a_dead_pid(root, "young")
        old = _temp_named_by_a_dead_pid(root, "old")
        os.utime(old, (time.time() - UNMARKED_STALE_S - 60,) * 2)
        remove_stale_temps(root)
        assert live.is_dir() and unmarked.is_dir() and not old.exists()
    finally:
        holder.kill()
        holder.wait()
    remove_stale_temps(root)
    assert not live.exists() and unmarked.is_dir()


def test_damaged_wheelhouse_is_rebuilt(tmp_path: Path, links: Path) -> None:
    root = tmp_path / "wh"
    first = ensure_wheelhouse(["tinydep"], offline(links), root, log=lambda m: None)
    (first.path / first.wheels[0]).unlink()
    messages: list[str] = []
    again = ensure_wheelhouse(["tinydep"], offline(links), root, log=messages.append)
    assert (again.path / again.wheels[0]).is_file()
    assert "incomplete or damaged" in messages[0]


def run_python(python: Path, code: str) -> str:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


INSTALLERS = ["pip", pytest.param("uv", marks=pytest.mark.skipif(find_uv() is None, reason="uv is not installed"))]


@pytest.mark.slow
@pytest.mark.parametrize("installer", INSTALLERS)
def test_env_from_wheelhouse_with_extra_wheels(tmp_path: Path, links: Path, installer: str) -> None:
    wheelhouse = ensure_wheelhouse(["tinyapp==2.0"], offline(links), tmp_path / "wh", log=lambda m: None)
    extras = tmp_path / "extras"
    extras.mkdir()
    extra = write_wheel(extras, "tinyextra", "1.0")
    messages: list[str] = []
    kw = dict(root=tmp_path / "envs", installer=installer)
    env = ensure_env(wheelhouse, extra_wheels=[extra], log=messages.append, **kw)
    assert env.path.name == f"stack-{env.key}" and env.python == env.path / "bin" / "python"
    assert env.installer == installer
    code = "import tinyapp, tinydep, tinyextra; print(tinyapp.__version__, tinydep.__version__, tinyextra.__version__)"
    assert run_python(env.python, code) == "2.0 1.0 1.0"
    assert "creating venv" in messages[0] and env.log_path.is_file()

    messages.clear()
    assert ensure_env(wheelhouse, extra_wheels=[extra], log=messages.append, **kw) == env
    assert messages == [f"env {env.path.name}: reusing {env.path}"]

    # A new build of an extra wheel reinstalls only the extras.
    extra.unlink()
    newer = write_wheel(extras, "tinyextra", "1.1")
    messages.clear()
    ensure_env(wheelhouse, extra_wheels=[newer], log=messages.append, **kw)
    assert not any("creating venv" in m for m in messages)
    assert run_python(env.python, "import tinyextra; print(tinyextra.__version__)") == "1.1"

    # An env whose base install never finished is rebuilt from scratch.
    (env.path / BASE_MARKER).unlink()
    messages.clear()
    ensure_env(wheelhouse, extra_wheels=[newer], log=messages.append, **kw)
    assert "creating venv" in messages[0]
    assert run_python(env.python, code) == "2.0 1.0 1.1"


@pytest.mark.slow
@pytest.mark.parametrize("installer", INSTALLERS)
def test_env_installs_bytecode_where_the_runner_writes_none(tmp_path: Path, links: Path, installer: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner with PYTHONDONTWRITEBYTECODE=1 never caches what an import compiles: without
    bytecode from the install, every rank worker compiles torch's source again."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    wheelhouse = ensure_wheelhouse(["tinyapp==2.0"], offline(links), tmp_path / "wh", log=lambda m: None)
    extras = tmp_path / "extras"
    extras.mkdir()
    env = ensure_env(wheelhouse, extra_wheels=[write_wheel(extras, "tinyextra", "1.0")], root=tmp_path / "envs",
                     installer=installer, log=lambda m: None)
    site = Path(run_python(env.python, "import tinyapp, os; print(os.path.dirname(os.path.dirname(tinyapp.__file__)))"))
    for package in ("tinyapp", "tinydep", "tinyextra"):
        assert list((site / package / "__pycache__").glob("__init__.*.pyc")), f"{package}: no bytecode installed"


@pytest.mark.parametrize("installer", INSTALLERS)
def test_env_leaves_bytecode_to_the_first_import_where_the_runner_writes_it(
        tmp_path: Path, links: Path, installer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the env's processes write bytecode, the install compiles none (torch's whole tree is
    ~18 CPU-s; a cell imports a fraction of it) and the first import writes what it compiled; the
    mode is part of the env's key, so a runner that starts setting PYTHONDONTWRITEBYTECODE gets an
    env compiled at install instead of one that would compile on every import."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "")  # empty: Python writes bytecode (as nox's tests session sets it)
    wheelhouse = ensure_wheelhouse(["tinyapp==2.0"], offline(links), tmp_path / "wh", log=lambda m: None)
    env = ensure_env(wheelhouse, root=tmp_path / "envs", installer=installer, log=lambda m: None)
    site = Path(run_python(env.python, "import sysconfig; print(sysconfig.get_paths()['purelib'])"))
    assert not list((site / "tinyapp").glob("__pycache__/*.pyc")), "the install compiled bytecode"
    run_python(env.python, "import tinyapp")
    assert list((site / "tinyapp" / "__pycache__").glob("__init__.*.pyc")), "the first import wrote no bytecode"
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    compiled = ensure_env(wheelhouse, root=tmp_path / "envs", installer=installer, log=lambda m: None)
    assert compiled.path != env.path and list((compiled.path).rglob("tinydep/__pycache__/__init__.*.pyc"))


def test_one_env_per_stack_whoever_asks(tmp_path: Path, links: Path) -> None:
    """Two cells of one stack (fix_on / fix_off), an audit or a bisect probe: the same inputs, one env."""
    kw = dict(wheelhouse_root=tmp_path / "wh", env_root=tmp_path / "envs", log=lambda m: None)
    first = stack_env(["tinyapp==2.0"], offline(links), **kw)
    messages: list[str] = []
    second = stack_env(["tinyapp==2.0"], offline(links), **{**kw, "log": messages.append})
    assert second == first and messages[-1] == f"env {first.path.name}: reusing {first.path}"
    other = stack_env(["tinyapp==1.0"], offline(links), **kw)
    assert other.path != first.path
    assert sorted(p.name for p in (tmp_path / "envs").iterdir() if not p.name.startswith(".")) == sorted(
        [first.path.name, other.path.name])


def test_env_install_ignores_the_machines_pip_configuration(tmp_path: Path, links: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The wheelhouse decided the versions; a configured cap must not veto the install."""
    wheelhouse = ensure_wheelhouse(["tinyapp==2.0"], offline(links), tmp_path / "wh", log=lambda m: None)
    cap = tmp_path / "cap.txt"
    cap.write_text("tinyapp<2\n")
    monkeypatch.setenv("PIP_CONSTRAINT", str(cap))
    monkeypatch.setenv("UV_CONSTRAINT", str(cap))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nconstraint = {cap}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    env = ensure_env(wheelhouse, root=tmp_path / "envs", installer="pip", log=lambda m: None)
    assert run_python(env.python, "import tinyapp; print(tinyapp.__version__)") == "2.0"


def test_resolution_environment_keys_the_wheelhouse(tmp_path: Path) -> None:
    empty_a, empty_b, cap = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "cap.txt"
    empty_a.write_text("")
    empty_b.write_text("")
    cap.write_text("torch<=2.14.1\n")
    configured = {"global.constraint": str(cap), "global.cert": "/etc/ca.pem", "global.timeout": "60"}
    capped = resolution_environment(environ={}, config=configured)
    assert list(capped) == ["pip.conf:global.constraint"] and capped["pip.conf:global.constraint"].startswith("sha256:")
    lifted = resolution_environment(environ={"PIP_CONSTRAINT": str(empty_a)}, config=configured)
    assert lifted == resolution_environment(environ={"PIP_CONSTRAINT": str(empty_b)}, config=configured)
    assert lifted != capped and "pip.conf:global.constraint" not in lifted
    indexed = resolution_environment(environ={"PIP_EXTRA_INDEX_URL": "https://x/simple", "UV_INDEX_URL": "https://y",
                                              "PIP_DEFAULT_TIMEOUT": "180"}, config={})
    assert indexed == {"env:PIP_EXTRA_INDEX_URL": "https://x/simple", "env:UV_INDEX_URL": "https://y"}
    tags = {"python": "cp311", "platform": "linux-x86_64"}
    keys = {wheelhouse_key(["torch==2.15.0"], [], tags, environment=e) for e in (capped, lifted, indexed, {})}
    assert len(keys) == 4


def test_resolution_failure_names_its_cause(tmp_path: Path, links: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cap = tmp_path / "cap.txt"
    cap.write_text("tinyapp<2\n")
    monkeypatch.setenv("PIP_CONSTRAINT", str(cap))
    with pytest.raises(InfraError) as err:
        ensure_wheelhouse(["tinyapp==2.0"], offline(links), tmp_path / "wh", log=lambda m: None)
    message = str(err.value)
    assert "\n" not in message
    assert "caused by: The user requested tinyapp==2.0; The user requested (constraint) tinyapp<2" in message, message
    assert failure_line("Collecting x\nERROR: No matching distribution found for x==9\n") == (
        "ERROR: No matching distribution found for x==9")


@pytest.mark.parametrize("installer", INSTALLERS)
def test_env_install_failure_is_infra_with_log(tmp_path: Path, links: Path, installer: str) -> None:
    wheelhouse = ensure_wheelhouse(["tinydep"], offline(links), tmp_path / "wh", log=lambda m: None)
    # A valid wheel of the same name and version, other bytes: only the recorded hash tells.
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    (wheelhouse.path / wheelhouse.wheels[0]).write_bytes(write_wheel(swapped, "tinydep", "1.0", ("six",)).read_bytes())
    with pytest.raises(InfraError) as err:
        ensure_env(wheelhouse, root=tmp_path / "envs", installer=installer, log=lambda m: None)
    message = str(err.value)
    assert "\n" not in message and "install failed" in message and "hash" in message.lower()
    assert "HASH" in err.value.log.upper()
    env_dir = next((tmp_path / "envs").glob("stack-*"))
    assert "HASH" in (env_dir / "distci-install.log").read_text().upper()
    assert not (env_dir / MARKER).exists() and not (env_dir / BASE_MARKER).exists()


def test_installed_stack_is_used_as_it_is(tmp_path: Path, links: Path) -> None:
    """A preinstalled interpreter (here: a venv with tinyapp 1.0 and tinydep) runs as it is;
    what it lacks comes from local wheels, what it has at another version is an error."""
    machine = stack_env(["tinyapp==1.0"], offline(links), wheelhouse_root=tmp_path / "wh",
                        env_root=tmp_path / "machine", log=lambda m: None)
    extra_links = tmp_path / "carried"
    extra_links.mkdir()
    write_wheel(extra_links, "tinyextra", "1.0")
    messages: list[str] = []
    env, found = installed_env(str(machine.python), ["tinyapp", "tinyextra==1.0"], find_links=[str(extra_links)],
                               root=tmp_path / "envs", log=messages.append)
    assert found.versions == {"tinyapp": "1.0", "tinyextra": None}
    assert env.path.name.startswith("installed-") and env.python != machine.python
    where = "import tinyapp, tinyextra; print(tinyapp.__version__, tinyapp.__file__.startswith(%r), tinyextra.__version__)"
    assert run_python(env.python, where % str(machine.path)) == "1.0 True 1.0"
    assert not any(p.name.startswith("tinyapp") for p in env.path.rglob("tinyapp*")), "tinyapp was copied"
    messages.clear()
    again, _ = installed_env(str(machine.python), ["tinyapp", "tinyextra==1.0"], find_links=[str(extra_links)],
                             root=tmp_path / "envs", log=messages.append)
    assert again == env and "reusing" in messages[0]

    with pytest.raises(InfraError, match=r"has tinyapp 1\.0 \(the run needs tinyapp==2\.0\)"):
        installed_env(str(machine.python), ["tinyapp==2.0"], root=tmp_path / "envs", log=lambda m: None)
    with pytest.raises(InfraError, match="lacks tinyextra; put their wheels in a directory named by DISTCI_FIND_LINKS"):
        installed_env(str(machine.python), ["tinyextra"], root=tmp_path / "envs", log=lambda m: None)
    with pytest.raises(InfraError, match="has no tinytorch, which the run takes as installed"):
        installed_env(str(machine.python), [], present=["tinyapp", "tinytorch"], find_links=[str(extra_links)],
                      root=tmp_path / "envs", log=lambda m: None)


def test_pip_configuration_is_read_again_only_when_a_config_file_changes(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from distci.provision.pipconfig import pip_config_values

    conf = tmp_path / "xdg" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("[global]\nindex-url = https://first.invalid/simple\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert pip_config_values()["global.index-url"] == "https://first.invalid/simple"
    conf.write_text("[global]\nindex-url = https://second.invalid/simple\nconstraint = /c.txt\n")
    assert pip_config_values()["global.index-url"] == "https://second.invalid/simple"  # the file changed
    named = tmp_path / "named.conf"  # PIP_CONFIG_FILE names a file pip reads: it counts, unlike PIP_INDEX_URL
    named.write_text("[install]\nextra-index-url = https://third.invalid/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(named))
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.invalid/simple")
    values = pip_config_values()
    assert values["install.extra-index-url"] == "https://third.invalid/simple"
    assert "global.index-url" not in values  # pip reads no user file beside an existing PIP_CONFIG_FILE
