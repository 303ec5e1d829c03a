"""Wheelhouse and envs with real pip, offline: tiny hand-made wheels behind --no-index --find-links."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from distci.envs import BASE_MARKER, MARKER, ensure_env
from distci.errors import InfraError
from distci.wheelhouse import MANIFEST, ensure_wheelhouse, interpreter_tags, wheelhouse_key


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


def test_failed_download_leaves_no_wheelhouse(tmp_path: Path, links: Path) -> None:
    root = tmp_path / "wh"
    root.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = root / f".tmp-{dead.pid}-0123456789abcdef-crashed"
    stale.mkdir()
    (stale / MANIFEST).write_text("{}")
    with pytest.raises(InfraError) as err:
        ensure_wheelhouse(["tinyapp==1.0", "nosuchpkg==3.0"], offline(links), root, log=lambda m: None)
    message = str(err.value)
    assert "\n" not in message and "pip wheel failed" in message and "nosuchpkg" in message
    assert "nosuchpkg" in err.value.log
    assert not stale.exists()
    assert [p.name for p in root.iterdir() if not p.name.startswith(".")] == [
        f"{message.split()[1].rstrip(':')}.failed.log"
    ]


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


def test_env_from_wheelhouse_with_extra_wheels(tmp_path: Path, links: Path) -> None:
    wheelhouse = ensure_wheelhouse(["tinyapp==2.0"], offline(links), tmp_path / "wh", log=lambda m: None)
    extras = tmp_path / "extras"
    extras.mkdir()
    extra = write_wheel(extras, "tinyextra", "1.0")
    messages: list[str] = []
    env = ensure_env("cell-a", wheelhouse, root=tmp_path / "envs", extra_wheels=[extra], log=messages.append)
    assert env.path.name == f"cell-a-{env.key}" and env.python == env.path / "bin" / "python"
    code = "import tinyapp, tinydep, tinyextra; print(tinyapp.__version__, tinydep.__version__, tinyextra.__version__)"
    assert run_python(env.python, code) == "2.0 1.0 1.0"
    assert "creating venv" in messages[0] and env.log_path.is_file()

    messages.clear()
    assert ensure_env("cell-a", wheelhouse, root=tmp_path / "envs", extra_wheels=[extra], log=messages.append) == env
    assert messages == [f"env {env.path.name}: reusing {env.path}"]

    # A new build of an extra wheel reinstalls only the extras.
    extra.unlink()
    newer = write_wheel(extras, "tinyextra", "1.1")
    messages.clear()
    ensure_env("cell-a", wheelhouse, root=tmp_path / "envs", extra_wheels=[newer], log=messages.append)
    assert not any("creating venv" in m for m in messages)
    assert run_python(env.python, "import tinyextra; print(tinyextra.__version__)") == "1.1"

    # An env whose base install never finished is rebuilt from scratch.
    (env.path / BASE_MARKER).unlink()
    messages.clear()
    ensure_env("cell-a", wheelhouse, root=tmp_path / "envs", extra_wheels=[newer], log=messages.append)
    assert "creating venv" in messages[0]
    assert run_python(env.python, code) == "2.0 1.0 1.1"


def test_env_install_failure_is_infra_with_log(tmp_path: Path, links: Path) -> None:
    wheelhouse = ensure_wheelhouse(["tinydep"], offline(links), tmp_path / "wh", log=lambda m: None)
    wheel = wheelhouse.path / wheelhouse.wheels[0]
    wheel.write_bytes(wheel.read_bytes() + b"corrupted")
    with pytest.raises(InfraError) as err:
        ensure_env("cell-b", wheelhouse, root=tmp_path / "envs", log=lambda m: None)
    message = str(err.value)
    assert "\n" not in message and "pip install failed" in message
    assert "HASH" in err.value.log.upper()
    env_dir = next((tmp_path / "envs").glob("cell-b-*"))
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in (env_dir / "distci-install.log").read_text()
    assert not (env_dir / MARKER).exists() and not (env_dir / BASE_MARKER).exists()
