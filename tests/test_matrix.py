"""matrix.toml: validation errors, expansion, include/exclude, ids, selection, Actions matrix."""

from __future__ import annotations

import dataclasses
import re
from functools import partial
from pathlib import Path

import pytest

from distci.errors import MatrixError, SelectionError
from distci.external.spec import suite_names
from distci.matrix import load_matrix
from distci.cells import Cell

REPO = Path(__file__).resolve().parent.parent

BASE = """\
schema = 1

[defaults]
tiers = ["nightly"]

[accelerators.cpu]
backend = "gloo"
runner = ["ubuntu-latest"]
archs = ["x86_64", "aarch64"]
variants = ["cpu"]

[accelerators.cuda]
backend = "nccl"
runner = ["self-hosted", "gpu-2"]
archs = ["x86_64"]
variants = ["cu130"]

[accelerators.npu]
backend = "hccl"
runner = ["self-hosted", "npu"]
archs = ["aarch64"]
variants = ["cann8"]

[[matrix]]
accelerator = "cpu"
torch = "2.13.0"
torchao = "0.18.0"

[tiers.pr]
description = "per PR"

[tiers.nightly]
blocking_suites = []
"""


def write(tmp_path: Path, extra: str = "", base: str = BASE) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(base + extra)
    return path


def error_of(tmp_path: Path, extra: str = "", base: str = BASE) -> str:
    with pytest.raises(MatrixError) as err:
        load_matrix(write(tmp_path, extra, base))
    message = str(err.value)
    assert "\n" not in message, message
    return message


def line_of(text: str, needle: str, occurrence: int = 1) -> int:
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    return hits[occurrence - 1]


# ----------------------------------------------------------------------------- errors


def test_unknown_block_key_names_block_line_and_suggestion(tmp_path: Path) -> None:
    extra = '\n[[matrix]]\naccelerator = "cpu"\ntorch = "2.13.0"\ntorchoa = "0.18.0"\n'
    message = error_of(tmp_path, extra)
    line = line_of(BASE + extra, "torchoa")
    assert (
        message == f"{tmp_path / 'matrix.toml'}:{line}: [[matrix]] #2: unknown key 'torchoa' (did you mean 'torchao'?)"
    )


def test_unknown_key_without_a_close_match_lists_the_allowed_keys(tmp_path: Path) -> None:
    message = error_of(tmp_path, "\n[[exclude]]\nzzz = 1\n")
    assert message.endswith(
        "[[exclude]] #1: unknown key 'zzz'; match on: accelerator, arch, variant, torch, "
        "torchao, torchtitan, torch_npu, fixes, world_size, nodes"
    )


@pytest.mark.parametrize(
    ("extra", "base_edit", "expected", "needle"),
    [
        (
            "\n[[matrx]]\ntorch = '2.13.0'\n",
            None,
            "top level: unknown key 'matrx' (did you mean 'matrix'?)",
            "[[matrx]]",
        ),
        (
            "",
            ('runner = ["ubuntu-latest"]', 'runners = ["ubuntu-latest"]'),
            "[accelerators.cpu]: unknown key 'runners' (did you mean 'runner'?)",
            "runners",
        ),
        (
            "",
            ("blocking_suites = []", "blocking_suite = []"),
            "[tiers.nightly]: unknown key 'blocking_suite' (did you mean 'blocking_suites'?)",
            "blocking_suite",
        ),
        (
            "",
            ('tiers = ["nightly"]', 'tiers = ["nightly"]\nworldsize = 2'),
            "[defaults]: unknown key 'worldsize' (did you mean 'world_size'?)",
            "worldsize",
        ),
        (
            "\n[[include]]\nmatch = {accelerator = 'cpu'}\ntier = ['pr']\n",
            None,
            "[[include]] #1: unknown key 'tier' (did you mean 'tiers'?)",
            "tier = ",
        ),
        (
            "\n[[include]]\nmatch = {acelerator = 'cpu'}\ntiers = ['pr']\n",
            None,
            "[[include]] #1: unknown key 'match.acelerator' (did you mean 'accelerator'?)",
            "acelerator",
        ),
        (
            "\n[[exclude]]\ntorch_version = '2.13.0'\n",
            None,
            "[[exclude]] #1: unknown key 'torch_version'",
            "torch_version",
        ),
        (
            "",
            ('torch = "2.13.0"', 'torch = ">=>2"'),
            "[[matrix]] #1: torch = '>=>2': not a valid source; allowed:",
            ">=>2",
        ),
        (
            "",
            ('torch = "2.13.0"', "torch = 2.13"),
            '[[matrix]] #1: torch = 2.13: must be a string (quote it: torch = "2.13")',
            "torch = 2.13",
        ),
        (
            "",
            ('torchao = "0.18.0"', 'torchao = "nightly:2026-02-30"'),
            "[[matrix]] #1: torchao = 'nightly:2026-02-30': a nightly date is written 'nightly:YYYY-MM-DD'",
            "nightly:",
        ),
        (
            "",
            ('accelerator = "cpu"', 'accelerator = "gpu"'),
            "[[matrix]] #1: unknown accelerator 'gpu'",
            'accelerator = "gpu"',
        ),
        (
            "",
            ('tiers = ["nightly"]', 'tiers = ["nightyl"]'),
            "[defaults]: unknown tier 'nightyl' (did you mean 'nightly'?)",
            "nightyl",
        ),
        (
            "",
            ('tiers = ["nightly"]', 'tiers = ["nightly"]\nworld_size = -1'),
            "[defaults]: 'world_size' must be a positive integer (got -1)",
            "world_size",
        ),
        (
            "",
            ('tiers = ["nightly"]', 'tiers = ["nightly"]\ntorchao = "newest"'),
            "[defaults]: torchao = 'newest': not a valid source",
            "newest",
        ),
        (
            "",
            ('torchao = "0.18.0"', 'torchao = "0.18.0"\ntiers = ["nightyl"]'),
            "[[matrix]] #1: unknown tier 'nightyl' (did you mean 'nightly'?)",
            "nightyl",
        ),
        (
            "",
            ('torch = "2.13.0"', 'torch = ["2.13.0", "==2.13.0"]'),
            "[[matrix]] #1: cell 'cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on' is produced twice (also by this block)",
            "[[matrix]]",
        ),
        (
            "\n[[matrix]]\naccelerator = 'cpu'\ntorch = '2.13.0'\ntorchao = '0.18.0'\n",
            None,
            "[[matrix]] #2: cell 'cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on' is produced twice (also by [[matrix]] #1)",
            ("[[matrix]]", 2),
        ),
        (
            "",
            ('torchao = "0.18.0"', 'torchao = "0.18.0"\nworld_size = 0'),
            "[[matrix]] #1: 'world_size' must be a positive integer (got 0)",
            "world_size",
        ),
        (
            "",
            ('torchao = "0.18.0"', 'torchao = "0.18.0"\nworld_size = "two"'),
            "[[matrix]] #1: 'world_size' must be a positive integer (got 'two')",
            "world_size",
        ),
        (
            "",
            ('torchao = "0.18.0"', 'torchao = "0.18.0"\nworld_size = true'),
            "[[matrix]] #1: 'world_size' must be a positive integer (got True)",
            "world_size",
        ),
        (
            "",
            ('torchao = "0.18.0"', 'torchao = "0.18.0"\nfixes = "maybe"'),
            '[[matrix]] #1: fixes = \'maybe\' must be "on" or "off"',
            "fixes",
        ),
        (
            "",
            ('torchao = "0.18.0"', 'torchao = "0.18.0"\nfixes = true'),
            '[[matrix]] #1: fixes = True must be "on" or "off" (write "on")',
            "fixes",
        ),
        (
            "\n[[include]]\nmatch = {accelerator = 'cuda'}\ntiers = ['pr']\n",
            None,
            "[[include]] #1: matches no cell; fix 'match' or delete the rule",
            "match =",
        ),
        (
            "\n[[include]]\nmatch = {torch = '2.14.0'}\ntiers = ['pr']\n",
            None,
            "[[include]] #1: matches no cell",
            "match =",
        ),
        (
            "\n[[exclude]]\naccelerator = 'cpu'\ntorch = '2.12.0'\n",
            None,
            "[[exclude]] #1: matches no cell; fix the values or delete the rule",
            "[[exclude]]",
        ),
        (
            "\n[[exclude]]\ntorch = '2.13.0'\n[[include]]\nmatch = {torch = '2.13.0'}\ntiers = ['pr']\n",
            None,
            "[[include]] #1: matches no cell (the cells it matches are removed by [[exclude]])",
            "match =",
        ),
        ("\n[[include]]\nmatch = {torch = '2.13.0'}\n", None, "[[include]] #1: sets nothing", "[[include]]"),
        (
            "",
            ('torchao = "0.18.0"', 'torchao = "0.18.0"\ntorch_npu = "2.13.0"'),
            "[[matrix]] #1: torch_npu is only for accelerator 'npu'",
            "torch_npu",
        ),
        (
            "\n[[matrix]]\naccelerator = 'npu'\ntorch = '2.13.0'\n",
            None,
            "[[matrix]] #2: an npu cell needs torch_npu",
            ("[[matrix]]", 2),
        ),
        (
            "",
            ('torchao = "0.18.0"', 'torchao = "0.18.0"\nvariant = "cu130"'),
            "[[matrix]] #1: variant 'cu130' is not in [accelerators.cpu] variants (cpu)",
            'variant = "cu130"',
        ),
        ("", ('torch = "2.13.0"\n', ""), "[[matrix]] #1: missing key 'torch'", ("[[matrix]]", 1)),
        ("", ('torch = "2.13.0"', 'torch = "none"'), "[[matrix]] #1: torch = 'none' is not allowed", 'torch = "none"'),
        (
            "",
            ("[accelerators.cpu]", "[accelerators.cpus]"),
            "[accelerators.cpus]: unknown accelerator 'cpus'",
            "[accelerators.cpus]",
        ),
        ("", ('backend = "gloo"', 'backend = "mpi"'), "[accelerators.cpu]: backend 'mpi' is not one of", "mpi"),
        ("", ("schema = 1", "schema = 2"), "top level: 'schema' must be 1 (found 2)", "schema"),
        (
            "",
            ('torchao = "0.18.0"', 'torchao = "0.18.0"\ntorchtitan = ['),
            "invalid TOML: Invalid value (at line 30, column 2)",
            None,
        ),
    ],
)
def test_bad_input_gives_one_line_naming_the_key(
    tmp_path: Path, extra: str, base_edit: tuple[str, str] | None, expected: str, needle: object
) -> None:
    base = BASE
    if base_edit:
        assert base_edit[0] in base
        base = base.replace(base_edit[0], base_edit[1], 1)
    message = error_of(tmp_path, extra, base)
    prefix, _, rest = message.partition(".toml")
    assert rest.lstrip(":0123456789 ").startswith(expected), message
    if needle is not None:
        text = base + extra
        line = line_of(text, *needle) if isinstance(needle, tuple) else line_of(text, needle)
        assert re.match(rf"^:{line}: ", rest), f"expected line {line}: {message}"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(MatrixError, match="file not found"):
        load_matrix(tmp_path / "matrix.toml")


# ----------------------------------------------------------------------------- expansion


RULES = """
[[matrix]]
accelerator = "cuda"
torch = ["2.14.1", "nightly"]
torchao = ["0.18.0", "nightly"]
world_size = [2, 4]

[[matrix]]
accelerator = "cpu"
arch = "aarch64"
torch = "nightly:2026-11-20"
torchtitan = "git:torchtitan@main"
fixes = ["on", "off"]

[[matrix]]
accelerator = "npu"
torch = "2.13.0"
torchao = "none"
torch_npu = "~=2.13.0"

[[exclude]]
torch = "nightly"
torchao = "0.18.0"

[[exclude]]
accelerator = "cuda"
torch = "2.14.1"
torchao = "nightly"

[[include]]
match = { accelerator = "cuda", world_size = 4 }
runner = ["self-hosted", "gpu-4"]
suites = ["suites/regressions"]

[[include]]
match = { torch = ["==2.13.0", "2.14.1"], fixes = "on" }
tiers = ["pr", "nightly"]
timeout = 600
"""


def test_product_exclude_include(tmp_path: Path) -> None:
    matrix = load_matrix(write(tmp_path, RULES))
    cells = {c.id: c for c in matrix.cells}
    assert list(cells) == [
        "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on",
        "cuda-cu130-torch_2.14.1-ao_0.18.0-ws2-fix_on",
        "cuda-cu130-torch_2.14.1-ao_0.18.0-ws4-fix_on",
        "cuda-cu130-torch_nightly-ao_nightly-ws2-fix_on",
        "cuda-cu130-torch_nightly-ao_nightly-ws4-fix_on",
        "cpu-cpu-aarch64-torch_nightly20261120-ao_none-titan_git_torchtitan_main-ws2-fix_on",
        "cpu-cpu-aarch64-torch_nightly20261120-ao_none-titan_git_torchtitan_main-ws2-fix_off",
        "npu-cann8-aarch64-torch_2.13.0-ao_none-npu_compat2.13.0-ws2-fix_on",
    ]
    ws4 = cells["cuda-cu130-torch_2.14.1-ao_0.18.0-ws4-fix_on"]
    assert ws4.runner == ("self-hosted", "gpu-4")
    assert ws4.suites == ("suites", "suites/regressions")
    assert ws4.tiers == ("pr", "nightly") and ws4.timeout == 600
    nightly = cells["cuda-cu130-torch_nightly-ao_nightly-ws4-fix_on"]
    assert (nightly.runner, nightly.tiers, nightly.timeout) == (("self-hosted", "gpu-4"), ("nightly",), 300)
    assert cells["npu-cann8-aarch64-torch_2.13.0-ao_none-npu_compat2.13.0-ws2-fix_on"].backend == "hccl"
    assert cells["cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"].tiers == ("pr", "nightly")


def test_id_is_made_of_declared_axes_only(tmp_path: Path) -> None:
    matrix = load_matrix(write(tmp_path, RULES))
    cell = matrix.cell("cuda-cu130-torch_nightly-ao_nightly-ws2-fix_on")
    pinned = dataclasses.replace(
        cell, torch=cell.torch.pin("2.15.0.dev20261120+cu130"), torchao=cell.torchao.pin("0.19.0.dev20261120+cu130")
    )
    assert pinned.id == cell.id
    assert [s.declared for s in pinned.sources] == ["nightly", "nightly", "none"]


def test_select_and_actions_include(tmp_path: Path) -> None:
    matrix = load_matrix(write(tmp_path, RULES))
    assert [c.id for c in matrix.select(tier="pr")] == [
        "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on",
        "cuda-cu130-torch_2.14.1-ao_0.18.0-ws2-fix_on",
        "cuda-cu130-torch_2.14.1-ao_0.18.0-ws4-fix_on",
        "npu-cann8-aarch64-torch_2.13.0-ao_none-npu_compat2.13.0-ws2-fix_on",
    ]
    assert [c.id for c in matrix.select(["cuda-*-ws4-*"], tier="nightly")] == [
        "cuda-cu130-torch_2.14.1-ao_0.18.0-ws4-fix_on",
        "cuda-cu130-torch_nightly-ao_nightly-ws4-fix_on",
    ]
    assert matrix.actions_include("pr")[2] == {
        "cell": "cuda-cu130-torch_2.14.1-ao_0.18.0-ws4-fix_on",
        "accelerator": "cuda",
        "family": "cuda",
        "runner": ["self-hosted", "gpu-4"],
        "world_size": 4,
        "python": "3.11",
        "tier": "pr",
    }
    with pytest.raises(
        SelectionError,
        match=r"no cell 'cpu-cpu-torch_2.13-ao_0.18.0-ws2-fix_on' \(did you mean: "
        r"cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on",
    ):
        matrix.select(["cpu-cpu-torch_2.13-ao_0.18.0-ws2-fix_on"])
    with pytest.raises(SelectionError, match="is not in tier 'pr'"):
        matrix.select(["cuda-cu130-torch_nightly-ao_nightly-ws2-fix_on"], tier="pr")
    with pytest.raises(SelectionError, match=r"unknown tier 'nighlty' \(did you mean 'nightly'\?\)"):
        matrix.select(tier="nighlty")


def test_repository_matrix() -> None:
    matrix = load_matrix(REPO / "matrix.toml")
    assert [c.id for c in matrix.select(tier="pr")] == ["cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"]
    default: Cell = matrix.cell("cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on")
    assert (default.backend, default.runner, default.world_size) == ("gloo", ("ubuntu-latest",), 2)
    assert set(default.tiers) == {"pr", "nightly", "release"}
    assert "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off" in [c.id for c in matrix.select(tier="nightly")]
    assert "cuda-cu130-torch_nightly-ao_nightly-ws2-fix_on" in [c.id for c in matrix.select(tier="nightly")]
    assert {c.accelerator for c in matrix.cells} == {"cpu", "cuda", "npu"}
    assert set(matrix.tiers) == {"pr", "nightly", "release", "multinode"}
    two_hosts = matrix.select(tier="multinode")
    assert [c.id for c in two_hosts] == ["cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-n2-fix_on",
                                        "cpu-cpu-torch_2.13.0-ao_0.18.0-ws4-n2-fix_on"]
    assert all(c.tiers == ("multinode",) for c in two_hosts), "a multi-node cell leaked into a default tier"


def test_repository_matrix_tracks_the_new_releases() -> None:
    matrix = load_matrix(REPO / "matrix.toml")
    ids = {c.id for c in matrix.cells}
    assert {"cpu-cpu-torch_2.15.0-ao_0.18.0-ws2-fix_on", "cpu-cpu-torch_2.15.0-ao_0.18.0-ws2-fix_off",
            "cuda-cu132-torch_2.15.0-ao_0.18.0-ws2-fix_on", "cpu-cpu-torch_latest-ao_latest-ws2-fix_on",
            "cpu-cpu-torch_2.13.0-ao_0.18.0-titan_0.3.0-ws2-fix_on"} <= ids
    assert any(c.torch_npu and c.torch_npu.spec == "~=2.14.0" for c in matrix.cells)
    titan = matrix.cell("cpu-cpu-torch_2.13.0-ao_0.18.0-titan_0.3.0-ws2-fix_on")
    assert any(r.startswith("triton") for r in titan.requirements)
    installed = [c for c in matrix.cells if c.torch.kind == "installed"]
    assert installed and all(not c.tiers for c in installed)


def test_requirements_attribute_is_validated(tmp_path: Path) -> None:
    matrix = load_matrix(write(tmp_path, '[[matrix]]\naccelerator = "cpu"\ntorch = "2.12.0"\n'
                                         'requirements = ["triton==3.7.1"]\n'))
    (cell,) = [c for c in matrix.cells if c.requirements]
    assert cell.requirements == ("triton==3.7.1",) and "requirements" in cell.as_dict()
    message = error_of(tmp_path, '[[matrix]]\naccelerator = "cpu"\ntorch = "2.12.0"\nrequirements = ["triton=>3"]\n')
    assert "requirements entry 'triton=>3' is not a pip requirement" in message


# ----------------------------------------------------------------------------- external suites

EXTERNAL = """\
schema = 1

[[suite]]
name = "torchtitan"
adapter = "torchtitan"
package = "torchtitan"

[[suite]]
name = "torchao"
adapter = "torchao"
package = "torchao"
"""


def test_external_is_an_attribute_that_include_adds_to(tmp_path: Path) -> None:
    suites = tmp_path / "external.toml"
    suites.write_text(EXTERNAL)
    extra = (
        '\n[[matrix]]\naccelerator = "cuda"\ntorch = "2.14.1"\ntorchao = ["0.17.0", "0.18.0"]\nexternal = ["torchao"]\n'
        '\n[[include]]\nmatch = { torchao = "0.18.0", accelerator = "cuda" }\nexternal = ["torchtitan", "torchao"]\n'
    )
    cells = {c.id: c for c in load_matrix(write(tmp_path, extra), external_names=partial(suite_names, suites)).cells}
    assert list(cells) == [
        "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on",
        "cuda-cu130-torch_2.14.1-ao_0.17.0-ws2-fix_on",
        "cuda-cu130-torch_2.14.1-ao_0.18.0-ws2-fix_on",
    ]
    assert cells["cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"].external == ()
    assert cells["cuda-cu130-torch_2.14.1-ao_0.17.0-ws2-fix_on"].external == ("torchao",)
    assert cells["cuda-cu130-torch_2.14.1-ao_0.18.0-ws2-fix_on"].external == ("torchao", "torchtitan")
    assert cells["cuda-cu130-torch_2.14.1-ao_0.18.0-ws2-fix_on"].as_dict()["external"] == ["torchao", "torchtitan"]


@pytest.mark.parametrize(
    ("extra", "base_edit", "expected", "needle"),
    [
        (
            '\n[[matrix]]\naccelerator = "cuda"\ntorch = "2.14.1"\nexternal = ["torchao", "torchtitann"]\n',
            None,
            "[[matrix]] #2: unknown external suite 'torchtitann' (did you mean 'torchtitan'?)",
            "torchtitann",
        ),
        (
            "\n[[include]]\nmatch = {accelerator = 'cpu'}\nexternal = 'megatron'\n",
            None,
            "[[include]] #1: unknown external suite 'megatron'; declared: torchtitan, torchao",
            "megatron",
        ),
        (
            "",
            ('tiers = ["nightly"]', 'tiers = ["nightly"]\nexternal = ["torchoa"]'),
            "[defaults]: unknown external suite 'torchoa' (did you mean 'torchao'?)",
            "torchoa",
        ),
        (
            "",
            ('torchao = "0.18.0"', 'torchao = "0.18.0"\nexternal = [1]'),
            "[[matrix]] #1: 'external' must be a list of strings (got [1])",
            "external",
        ),
    ],
)
def test_external_names_are_checked_against_the_suites_file(
    tmp_path: Path, extra: str, base_edit: tuple[str, str] | None, expected: str, needle: str
) -> None:
    suites = tmp_path / "external.toml"
    suites.write_text(EXTERNAL)
    base = BASE.replace(*base_edit, 1) if base_edit else BASE
    with pytest.raises(MatrixError) as err:
        load_matrix(write(tmp_path, extra, base), external_names=partial(suite_names, suites))
    message = str(err.value)
    assert message == f"{tmp_path / 'matrix.toml'}:{line_of(base + extra, needle)}: {expected}"


def test_external_without_a_suites_file_says_where_they_are_declared(tmp_path: Path) -> None:
    gone = tmp_path / "gone.toml"
    assert load_matrix(write(tmp_path), external_names=partial(suite_names, gone)).cells[0].external == ()  # not needed: not read
    with pytest.raises(MatrixError) as err:
        load_matrix(write(tmp_path, '\n[[include]]\nmatch = {accelerator = "cpu"}\nexternal = ["torchao"]\n'),
                    external_names=partial(suite_names, gone))
    assert str(err.value).endswith(
        f"[[include]] #1: 'external' names suites of {gone}, which does not exist; "
        "declare them there or remove 'external'"
    )


def test_without_external_names_only_the_shape_of_external_is_checked(tmp_path: Path) -> None:
    """Commands that run no external suite load the matrix without the external stage."""
    extra = '\n[[include]]\nmatch = {accelerator = "cpu"}\nexternal = ["megatron"]\n'
    assert load_matrix(write(tmp_path, extra)).cells[0].external == ("megatron",)
    with pytest.raises(MatrixError, match="'external' must be a list of strings"):
        load_matrix(write(tmp_path, extra.replace('["megatron"]', "[1]")))


def test_repository_matrix_runs_upstream_tests_on_pinned_cuda_stacks_only() -> None:
    """Upstream tests need a ref to check out (a release, not a nightly) and GPUs; the pr
    tier must stay a quick CPU run; the suites it names are the checkout's."""
    matrix = load_matrix(REPO / "matrix.toml", external_names=suite_names)
    with_external = [c for c in matrix.cells if c.external]
    assert with_external
    for cell in with_external:
        assert cell.accelerator == "cuda", cell.id
        assert "nightly" not in (cell.torch, cell.torchao, cell.torchtitan), cell.id
    assert not any(c.external for c in matrix.select(tier="pr"))


def test_a_sharded_tier_lists_each_cell_once_per_share(tmp_path: Path) -> None:
    sharded = BASE.replace("[tiers.nightly]\nblocking_suites = []\n", "[tiers.nightly]\nblocking_suites = []\nshards = 2\n")
    matrix = load_matrix(write(tmp_path, base=sharded))
    cell = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
    jobs = matrix.actions_include("nightly")
    assert [(e["cell"], e["shard"], e["shard_name"]) for e in jobs] == [(cell, "1/2", "1of2"), (cell, "2/2", "2of2")]
    assert [e["cell"] for e in matrix.actions_include("nightly", sharded=False)] == [cell]
    assert all("shard" not in e for e in matrix.actions_include("nightly", sharded=False))
    for bad in ("0", "1.5", "true", '"2"'):
        text = sharded.replace("shards = 2", f"shards = {bad}")
        assert "shards must be a whole number from 1 to 256" in error_of(tmp_path, base=text), bad


# ----------------------------------------------------------------------------- nodes


def test_nodes_default_to_one_and_stay_out_of_the_id(tmp_path: Path) -> None:
    cell = load_matrix(write(tmp_path)).cells[0]
    assert (cell.nodes, cell.ranks_per_node) == (1, 2)
    assert cell.id == "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
    assert "nodes" not in load_matrix(write(tmp_path)).actions_include("nightly")[0]


def test_nodes_multiply_cells_name_them_and_split_the_world(tmp_path: Path) -> None:
    matrix = load_matrix(write(tmp_path, base=BASE.replace('torchao = "0.18.0"\n',
                                                            'torchao = "0.18.0"\nworld_size = 4\nnodes = [1, 2, 4]\n')))
    assert [(c.id, c.ranks_per_node) for c in matrix.cells] == [
        ("cpu-cpu-torch_2.13.0-ao_0.18.0-ws4-fix_on", 4),
        ("cpu-cpu-torch_2.13.0-ao_0.18.0-ws4-n2-fix_on", 2),
        ("cpu-cpu-torch_2.13.0-ao_0.18.0-ws4-n4-fix_on", 1),
    ]
    assert matrix.cell("cpu-cpu-torch_2.13.0-ao_0.18.0-ws4-n2-fix_on").as_dict()["nodes"] == 2
    assert matrix.actions_include("nightly")[1]["nodes"] == 2


def test_nodes_in_rules(tmp_path: Path) -> None:
    base = BASE.replace('torchao = "0.18.0"\n', 'torchao = "0.18.0"\nnodes = [1, 2]\n')
    matrix = load_matrix(write(tmp_path, '\n[[exclude]]\nnodes = 2\n', base=base))
    assert [c.nodes for c in matrix.cells] == [1]


@pytest.mark.parametrize(("edit", "expected"), [
    ("nodes = 0", "[[matrix]] #1: 'nodes' must be a positive integer (got 0)"),
    ("nodes = \"two\"", "[[matrix]] #1: 'nodes' must be a positive integer (got 'two')"),
    ("nodes = 3", "[[matrix]] #1: world_size 2 is not a multiple of nodes = 3 (every node runs the same number "
                  "of ranks); change world_size or nodes"),
])
def test_bad_nodes_name_the_line(tmp_path: Path, edit: str, expected: str) -> None:
    base = BASE.replace('torchao = "0.18.0"\n', f'torchao = "0.18.0"\n{edit}\n')
    message = error_of(tmp_path, base=base)
    assert message.endswith(expected), message
    assert f":{line_of(base, edit)}: " in message


def test_bad_nodes_in_defaults(tmp_path: Path) -> None:
    message = error_of(tmp_path, base=BASE.replace('tiers = ["nightly"]', 'tiers = ["nightly"]\nnodes = -2'))
    assert message.endswith("[defaults]: 'nodes' must be a positive integer (got -2)")


def test_every_key_of_the_grammar_is_documented_in_the_schema_comment_and_has_help() -> None:
    """KEYS is the one declaration: a key added there without a word in matrix.toml's own
    schema comment (what users read) or without help fails here."""
    from distci.matrix_keys import KEYS

    schema = "\n".join(line for line in (REPO / "matrix.toml").read_text().splitlines() if line.startswith("#"))
    undocumented = [k.name for k in KEYS if not re.search(rf"\b{k.name}\b", schema)]
    assert not undocumented, f"keys missing from matrix.toml's schema comment: {undocumented}"
    assert all(k.help for k in KEYS)


# ----------------------------------------------------------------------------- baseline

TWINS = '\n[[matrix]]\naccelerator = "cpu"\ntorch = "nightly"\ntorchao = "0.18.0"\n'
RELEASE_CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
NIGHTLY_CELL = "cpu-cpu-torch_nightly-ao_0.18.0-ws2-fix_on"


def test_a_cell_declares_its_baseline_in_its_block_or_through_an_include(tmp_path: Path) -> None:
    in_block = load_matrix(write(tmp_path, TWINS + f'baseline = "{RELEASE_CELL}"\n'))
    assert {c.id: c.baseline for c in in_block.cells} == {RELEASE_CELL: None, NIGHTLY_CELL: RELEASE_CELL}
    assert in_block.cell(NIGHTLY_CELL).as_dict()["baseline"] == RELEASE_CELL
    assert "baseline" not in in_block.cell(RELEASE_CELL).as_dict()  # run.json's cell as before when none is set
    include = TWINS + f'\n[[include]]\nmatch = {{torch = "nightly"}}\nbaseline = "{RELEASE_CELL}"\n'
    assert load_matrix(write(tmp_path, include)).cell(NIGHTLY_CELL).baseline == RELEASE_CELL


@pytest.mark.parametrize(
    ("extra", "expected", "needle"),
    [
        (TWINS + 'baseline = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_of"\n',
         f"[[matrix]] #2: baseline 'cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_of' of cell '{NIGHTLY_CELL}' is not a "
         f"cell of this matrix (did you mean '{RELEASE_CELL}'?)", "baseline"),
        (TWINS + f'\n[[include]]\nmatch = {{torch = "nightly"}}\nbaseline = "{NIGHTLY_CELL}"\n',
         f"[[include]] #1: cell '{NIGHTLY_CELL}' names itself as its baseline (its own history is already what it is "
         "judged against); remove 'baseline'", "baseline"),
        (TWINS + "baseline = 3\n", "[[matrix]] #2: 'baseline' must be a cell id (a string, e.g. "
         "\"cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on\"; `nox -s matrix` lists them)", "baseline"),
        (TWINS + f'baseline = "{RELEASE_CELL}"\n\n[[exclude]]\ntorch = "2.13.0"\n',
         f"[[matrix]] #2: baseline '{RELEASE_CELL}' of cell '{NIGHTLY_CELL}' is not a cell of this matrix (it is "
         "removed by [[exclude]])", "baseline"),
        (TWINS + 'baseline = "gpu"\n',
         f"[[matrix]] #2: baseline 'gpu' of cell '{NIGHTLY_CELL}' is not a cell of this matrix; `nox -s matrix` "
         "lists the cells", "baseline"),
    ],
)
def test_a_baseline_names_another_cell_of_the_final_matrix(
    tmp_path: Path, extra: str, expected: str, needle: str
) -> None:
    with pytest.raises(MatrixError) as err:
        load_matrix(write(tmp_path, extra))
    assert str(err.value) == f"{tmp_path / 'matrix.toml'}:{line_of(BASE + extra, needle)}: {expected}"


def test_baseline_is_not_a_default(tmp_path: Path) -> None:
    """Every cell of [defaults] would take the same baseline, itself included: meaningless."""
    with pytest.raises(MatrixError, match=r"\[defaults\]: unknown key 'baseline'"):
        load_matrix(write(tmp_path, base=BASE.replace('tiers = ["nightly"]', 'tiers = ["nightly"]\nbaseline = "x"')))
