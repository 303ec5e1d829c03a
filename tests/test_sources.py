"""Sources: parsing matrix values, index configuration, pip arguments, and index listings.

The index tests read a real PEP 503 index built in a temp dir from tiny hand-made
wheels, both through file:// and through an HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import hashlib
import http.server
import io
import json
import subprocess
import threading
import zipfile
from pathlib import Path

import pytest
from packaging.tags import Tag, sys_tags
from packaging.version import Version

from distci.errors import ConfigError, InfraError, MatrixError, SourceError
from distci.provision.index import list_index_versions
from distci.provision.sources import IndexConfig, pip_args, requirement_lines
from distci.sources import Source
from distci.provision.resolve import list_candidates, resolve, resolve_sources


def write_wheel(directory: Path, name: str, version: str, tag: str = "py3-none-any") -> Path:
    """A minimal valid wheel: one module, METADATA, WHEEL, RECORD."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": f"Wheel-Version: 1.0\nGenerator: distci-tests\nRoot-Is-Purelib: true\nTag: {tag}\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(data.encode())}\n"
        for path, data in files.items()
    )
    files[f"{dist}.dist-info/RECORD"] = record + f"{dist}.dist-info/RECORD,,\n"
    path = directory / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(member, data)
    return path


HERE = next(iter(sys_tags()))
OTHER = "cp27-cp27mu-manylinux1_i686"  # a tag no modern interpreter accepts


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PEP 503 index with nightlies of `tinytorch` over three dates and one release."""
    root = tmp_path_factory.mktemp("index")
    files_dir = root / "files"
    files_dir.mkdir()
    here = f"{HERE.interpreter}-{HERE.abi}-{HERE.platform}"
    wheels = [
        write_wheel(files_dir, "tinytorch", "1.0.dev20260101+cpu", here),
        write_wheel(files_dir, "tinytorch", "1.0.dev20260102+cpu", here),
        write_wheel(files_dir, "tinytorch", "1.0.dev20260102+cpu", OTHER),
        write_wheel(files_dir, "tinytorch", "1.0.dev20260103+cpu", OTHER),
        write_wheel(files_dir, "tinytorch", "0.9.0", "py3-none-any"),
    ]
    page = root / "simple" / "tinytorch"
    page.mkdir(parents=True)
    links = "".join(
        f'<a href="../../files/{w.name.replace("+", "%2B")}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">'
        f"{w.name}</a>\n"
        for w in wheels
    )
    (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    json_page = {
        "meta": {"api-version": "1.0"},
        "name": "tinytorch",
        "files": [{"filename": w.name, "url": f"../../files/{w.name}", "hashes": {}} for w in wheels],
    }
    (page / "index.json").write_text(json.dumps(json_page))
    return root


class _IndexHandler(http.server.SimpleHTTPRequestHandler):
    """Serves index.json (PEP 691) when the client asks for JSON, like a real index."""

    def send_head(self):  # type: ignore[override]
        page = Path(self.translate_path(self.path)) / "index.json"
        if "json" in self.headers.get("Accept", "") and self.server.json_pages and page.is_file():  # type: ignore[attr-defined]
            body = page.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            return io.BytesIO(body)
        return super().send_head()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(params=["html", "json"])
def http_index(index: Path, request: pytest.FixtureRequest):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_IndexHandler, directory=str(index)))
    server.json_pages = request.param == "json"  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("package", "value", "kind", "spec", "fragment"),
    [
        ("torch", "2.13.0", "release", "==2.13.0", "torch_2.13.0"),
        ("torch", "==2.13.0", "release", "==2.13.0", "torch_2.13.0"),
        ("torch", ">=2.13,<2.15", "release", "<2.15,>=2.13", "torch_ge2.13_lt2.15"),
        ("torch", "2.13.*", "release", "==2.13.*", "torch_2.13.x"),
        ("torch", "2.12.0.dev20260301+cpu", "release", "==2.12.0.dev20260301+cpu", "torch_2.12.0.dev20260301_cpu"),
        ("torchao", "nightly", "nightly", "", "ao_nightly"),
        ("torch", "nightly:2026-11-20", "nightly", "2026-11-20", "torch_nightly20261120"),
        ("torch", "test:2.15.0", "test", "==2.15.0", "torch_test2.15.0"),
        ("torch", "wheelhouse:my-build", "wheelhouse", "my-build", "torch_wh_my_build"),
        ("torchtitan", "git:torchtitan@main", "git", "torchtitan@main", "titan_git_torchtitan_main"),
        ("torch_npu", "~=2.13.0", "release", "~=2.13.0", "npu_compat2.13.0"),
        ("torchtitan", "none", "none", "", "titan_none"),
    ],
)
def test_parse(package: str, value: str, kind: str, spec: str, fragment: str) -> None:
    source = Source.parse(package, value)
    assert (source.kind, source.spec, source.declared) == (kind, spec, value)
    assert source.id_fragment == fragment


@pytest.mark.parametrize(
    "value",
    [
        "newest",
        "2.13.0.banana",
        ">=>2",
        "",
        "nightly:2026-13-01",
        "nightly:20261120",
        "git:torchtitan",
        "git:@main",
        "wheelhouse:",
        "wheelhouse:root",
        "test:",
        2.13,
        2,
    ],
)
def test_parse_rejects_with_one_line_naming_key(value: object) -> None:
    with pytest.raises(MatrixError) as err:
        Source.parse("torch", value, where="matrix.toml:7")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"matrix.toml:7: torch = {value!r}")


def test_resolution_never_changes_the_id_fragment() -> None:
    nightly = Source.parse("torch", "nightly")
    assert nightly.pin("2.12.0.dev20260301+cpu").id_fragment == nightly.id_fragment == "torch_nightly"


# ----------------------------------------------------------------------------- config and pip


def test_index_config_from_env_and_pip_args() -> None:
    config = IndexConfig.from_env(
        {
            "DISTCI_INDEX_URL": "https://idx.invalid/simple",
            "DISTCI_EXTRA_INDEX_URLS": "https://a.invalid/simple  https://b.invalid/{variant}",
            "DISTCI_FIND_LINKS": "/wheels",
            "DISTCI_NIGHTLY_INDEX_URL": "https://n.invalid/whl/nightly/{variant}",
        }
    )
    sources = [Source.parse("torch", "nightly"), Source.parse("torchao", "0.18.0")]
    assert pip_args(sources, config, variant="cu130") == [
        "--index-url",
        "https://idx.invalid/simple",
        "--extra-index-url",
        "https://a.invalid/simple",
        "--extra-index-url",
        "https://b.invalid/cu130",
        "--find-links",
        "/wheels",
        "--extra-index-url",
        "https://n.invalid/whl/nightly/cu130",
        "--pre",
    ]


def test_pip_args_empty_config_defers_to_pip() -> None:
    config = IndexConfig.from_env({})
    assert pip_args([Source.parse("torch", "2.13.0"), Source.parse("torchao", "none")], config) == []


@pytest.mark.parametrize(
    ("value", "variable"),
    [
        ("nightly", "DISTCI_NIGHTLY_INDEX_URL"),
        ("nightly:2026-11-20", "DISTCI_NIGHTLY_INDEX_URL"),
        ("test:2.15.0", "DISTCI_TEST_INDEX_URL"),
        ("wheelhouse:mybuild", "DISTCI_WHEELHOUSE_MYBUILD"),
    ],
)
def test_missing_index_variable_is_named(value: str, variable: str) -> None:
    with pytest.raises(ConfigError) as err:
        pip_args([Source.parse("torch", value)], IndexConfig.from_env({}))
    assert str(err.value).startswith(f"{variable} is not set")


def test_variant_placeholder_needs_a_variant() -> None:
    config = IndexConfig.from_env({"DISTCI_NIGHTLY_INDEX_URL": "file:///x/{variant}"})
    with pytest.raises(ConfigError, match="DISTCI_NIGHTLY_INDEX_URL contains {variant}"):
        pip_args([Source.parse("torch", "nightly")], config)


def test_requirement_lines() -> None:
    sources = [
        Source.parse("torch", "2.13.0"),
        Source.parse("torchao", ">=0.17"),
        Source.parse("torchtitan", "none"),
        Source.parse("torch_npu", "~=2.13.0"),
    ]
    assert requirement_lines(sources) == ["torch==2.13.0", "torchao>=0.17", "torch_npu~=2.13.0"]
    nightly = Source.parse("torch", "nightly")
    with pytest.raises(SourceError, match="resolve_sources"):
        requirement_lines([nightly])
    assert requirement_lines([nightly.pin("1.0.dev20260102+cpu")]) == ["torch==1.0.dev20260102+cpu"]


# ----------------------------------------------------------------------------- index listing


def test_list_index_versions_file_url(index: Path) -> None:
    entries = list_index_versions((index / "simple").as_uri(), "tinytorch")
    assert [str(e.version) for e in entries] == [
        "0.9.0",
        "1.0.dev20260101+cpu",
        "1.0.dev20260102+cpu",
        "1.0.dev20260102+cpu",
        "1.0.dev20260103+cpu",
    ]
    newest = entries[-1]
    assert newest.date == dt.date(2026, 1, 3)
    assert newest.filename.startswith("tinytorch-1.0.dev20260103+cpu-")
    assert newest.url.startswith("file://") and Path(newest.url[len("file://") :].replace("%2B", "+")).is_file()
    assert newest.sha256 == hashlib.sha256((index / "files" / newest.filename).read_bytes()).hexdigest()
    assert entries[0].date is None and entries[0].tags == {Tag("py3", "none", "any")}


def test_list_index_versions_http(http_index: str, index: Path) -> None:
    entries = list_index_versions(http_index, "tinytorch")
    assert [e.version for e in entries] == [
        Version(v)
        for v in ["0.9.0", "1.0.dev20260101+cpu", "1.0.dev20260102+cpu", "1.0.dev20260102+cpu", "1.0.dev20260103+cpu"]
    ]
    assert all(e.url.startswith(http_index.rsplit("/", 1)[0] + "/files/") for e in entries)
    with pytest.raises(SourceError, match="404"):
        list_index_versions(http_index, "nosuchpackage")


def test_nightly_candidates_and_resolution(index: Path) -> None:
    config = IndexConfig.from_env({"DISTCI_NIGHTLY_INDEX_URL": (index / "simple").as_uri()})
    newest = Source.parse("tinytorch", "nightly")
    candidates = list_candidates(newest, config)
    # 2026-01-03 exists only for another platform, so it is not a candidate here.
    assert [(str(e.version), e.date) for e in candidates] == [
        ("1.0.dev20260101+cpu", dt.date(2026, 1, 1)),
        ("1.0.dev20260102+cpu", dt.date(2026, 1, 2)),
    ]
    assert resolve(newest, config).resolved == "1.0.dev20260102+cpu"
    dated = resolve_sources([Source.parse("tinytorch", "nightly:2026-01-01")], config)[0]
    assert (dated.resolved, dated.declared, dated.id_fragment) == (
        "1.0.dev20260101+cpu",
        "nightly:2026-01-01",
        "tinytorch_nightly20260101",
    )
    with pytest.raises(SourceError, match="no nightly of that date"):
        resolve(Source.parse("tinytorch", "nightly:2026-01-03"), config)


def test_release_candidates_from_configured_index(index: Path) -> None:
    config = IndexConfig.from_env({"DISTCI_INDEX_URL": (index / "simple").as_uri()})
    source = Source.parse("tinytorch", ">=0.1")
    assert [str(e.version) for e in list_candidates(source, config)] == ["0.9.0"]
    assert resolve(source, config).resolved == "0.9.0"


def test_latest_is_the_newest_final_release(tmp_path: Path) -> None:
    project = tmp_path / "simple" / "tinytorch"
    project.mkdir(parents=True)
    for version in ("1.0", "1.2", "1.10rc1", "1.3.dev20260101"):
        write_wheel(project, "tinytorch", version)
    config = IndexConfig.from_env({"DISTCI_INDEX_URL": (tmp_path / "simple").as_uri()})
    latest = Source.parse("tinytorch", "latest")
    assert not latest.is_exact
    with pytest.raises(SourceError, match="resolve_sources"):
        requirement_lines([latest])
    (found,) = resolve_sources([latest], config)
    assert (found.resolved, found.id_fragment, found.declared) == ("1.2", "tinytorch_latest", "latest")
    assert requirement_lines([found]) == ["tinytorch==1.2"]


def test_installed_needs_no_download() -> None:
    installed = Source.parse("torch", "installed")
    assert (installed.kind, installed.id_fragment, installed.is_exact) == ("installed", "torch_installed", True)
    assert requirement_lines([installed, Source.parse("torchao", "0.17.0")]) == ["torchao==0.17.0"]
    assert resolve(installed, IndexConfig.from_env({})) is installed


def test_wheelhouse_source(tmp_path: Path) -> None:
    write_wheel(tmp_path, "tinytorch", "1.0")
    write_wheel(tmp_path, "tinytorch", "1.1")
    config = IndexConfig.from_env({"DISTCI_WHEELHOUSE_LOCAL": str(tmp_path)})
    source = Source.parse("tinytorch", "wheelhouse:local")
    assert pip_args([source], config) == ["--find-links", str(tmp_path.resolve())]
    assert requirement_lines(resolve_sources([source], config)) == ["tinytorch==1.1"]


def test_git_source_resolves_to_a_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    (repo / "f").write_text("x")
    subprocess.run([*git, "-C", str(repo), "add", "f"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "c"], check=True)
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    config = IndexConfig.from_env({"DISTCI_GIT_TINY": str(repo)})
    source = resolve(Source.parse("torchtitan", "git:tiny@main"), config)
    assert requirement_lines([source]) == [f"torchtitan @ git+{repo.resolve().as_uri()}@{sha}"]
    with pytest.raises(SourceError, match="revision 'nope' not found"):
        resolve(Source.parse("torchtitan", "git:tiny@nope"), config)
    with pytest.raises(ConfigError, match="DISTCI_GIT_OTHER is not set"):
        resolve(Source.parse("torchtitan", "git:other@main"), config)


def test_the_index_reader_retries_passing_troubles_and_stops(index: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 503 (then a 429 with Retry-After) is retried and the page read; an index that
    keeps answering 503 is infra after the retries, naming the status and the tries."""
    import distci.provision.index as index_module

    answers: list[int] = []

    class Flaky(_IndexHandler):
        def send_head(self):  # type: ignore[override]
            if self.server.troubles:  # type: ignore[attr-defined]
                code = self.server.troubles.pop(0)  # type: ignore[attr-defined]
                answers.append(code)
                self.send_response(code)
                self.send_header("Retry-After", "0")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            answers.append(200)
            return super().send_head()

    monkeypatch.setitem(index_module.INDEX_RETRY, "backoff_factor", 0)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Flaky, directory=str(index)))
    server.json_pages = False  # type: ignore[attr-defined]
    server.troubles = [503, 429]  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/simple"
        assert len(list_index_versions(url, "tinytorch")) == 5 and answers == [503, 429, 200]
        server.troubles = [503] * 10  # type: ignore[attr-defined]
        with pytest.raises(InfraError, match=r"HTTP 503 .*\(5 tries\)"):
            list_index_versions(url, "tinytorch")
    finally:
        server.shutdown()
        server.server_close()
