"""The external-suite adapter kind, as data: where upstream's tests come from, how they
are launched, how their outcomes are read.

An external suite is a set of upstream's own distributed tests (torchtitan's
integration tests, torchao's Float8 scripts) run at the upstream version the cell
resolved to. It is declared in suites/external.toml; this module loads and checks that
file and nothing else, so the fetch, launch and read steps get plain records.

    schema = 1
    [[suite]]
    name = "torchao"              test ids: external/<name>/...
    adapter = "torchao"           torchao | torchtitan (distci/external/adapters/)
    package = "torchao"           the cell package whose version/commit picks the ref
    git = "TORCHAO"               repository from $DISTCI_GIT_TORCHAO (URL or path)
    ref = "v{version}"            ref for a release version; a git install uses its commit
    sdist = false                 fall back to the package's sdist when there is no git
    keep = ["test/float8"]        what of the checkout the suite needs (the cache keeps only this)
    timeout = 600                 seconds per case (a case may override)
    env = { KEY = "value" }       set in every launch of the suite
    requires_accelerator = "cuda" a case's default; requires_sm = 89, requires_modules = [..]
    upstream = ["features"]       (torchtitan) upstream's own declared groups to run
    [suite.requires_sm_by_group]  (torchtitan) e.g. h100 = 90
    [[suite.case]]                one declared case, by kind:
      kind = "functions"          (default with `script`) each test function of `script`, one
                                  torchrun launch of `nproc` ranks each: the script's own
                                  `tests = [...]` list, or `functions`, less `exclude`; `setup`
                                  builds their argument (default: the script's setup_distributed)
      kind = "pytest"             `script` is a pytest file (`args` go to pytest): one Result
                                  per JUnit testcase
      kind = "train"              (default without `script`) torchtitan: `name` + `args`, trained
                                  by upstream's own integration runner on `nproc` GPUs
      also: variant (an id suffix "[variant]"), timeout, env, requires_accelerator,
      requires_sm, requires_modules, expected_losses (a loss file in the checkout), loss_rtol
      (0: equal as printed), min_loss_steps
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from distci.errors import ConfigError

SCHEMA = 1
DEFAULT_PATH = Path("suites") / "external.toml"
CHECKOUT_SUITES = Path(__file__).resolve().parents[2] / DEFAULT_PATH
"""The checkout's external suites: the file cell runs read (distci.run.cellrun), wherever the
matrix file itself lives."""
ACCELERATORS = ("cpu", "cuda", "npu")

SUITE_KEYS = ("name", "adapter", "package", "git", "ref", "sdist", "keep", "timeout", "env",
              "requires_accelerator", "requires_sm", "requires_modules", "upstream",
              "requires_sm_by_group", "case")
CASE_KEYS = ("name", "kind", "script", "nproc", "args", "functions", "exclude", "setup", "variant",
             "timeout", "env", "requires_accelerator", "requires_sm", "requires_modules",
             "expected_losses", "loss_rtol", "min_loss_steps")
CASE_KINDS = ("functions", "pytest", "train")
ADAPTER_KINDS = {"torchao": ("functions", "pytest"), "torchtitan": ("train",)}


@dataclass(frozen=True)
class Requirements:
    """What a case needs from the cell; a cell lacking it records the case as skipped, with why."""

    nproc: int = 1
    accelerator: str | None = None
    sm: int | None = None
    modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class CaseSpec:
    """One declared case of a suite, as written (an adapter expands it into Cases)."""

    kind: str
    name: str = ""
    script: str = ""
    nproc: int = 1
    args: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    setup: str | None = None
    variant: str = ""
    timeout: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    requires_accelerator: str | None = None
    requires_sm: int | None = None
    requires_modules: tuple[str, ...] = ()
    expected_losses: str | None = None
    loss_rtol: float = 0.0
    min_loss_steps: int = 1


@dataclass(frozen=True)
class SuiteSpec:
    name: str
    adapter: str
    package: str
    git: str | None = None
    ref: str = "v{version}"
    sdist: bool = False
    keep: tuple[str, ...] = ()
    timeout: int = 600
    env: Mapping[str, str] = field(default_factory=dict)
    requires_accelerator: str | None = None
    requires_sm: int | None = None
    requires_modules: tuple[str, ...] = ()
    upstream: tuple[str, ...] = ()
    requires_sm_by_group: Mapping[str, int] = field(default_factory=dict)
    cases: tuple[CaseSpec, ...] = ()
    where: str = ""

    def requirements(self, case: CaseSpec | None = None, *, nproc: int | None = None,
                     sm: int | None = None) -> Requirements:
        """A case's requirements: its own values over the suite's defaults."""
        accelerator = (case.requires_accelerator if case and case.requires_accelerator else None) \
            or self.requires_accelerator
        modules = tuple(dict.fromkeys(self.requires_modules + (case.requires_modules if case else ())))
        return Requirements(
            nproc=nproc if nproc is not None else (case.nproc if case else 1),
            accelerator=None if accelerator == "cpu" else accelerator,
            sm=sm or (case.requires_sm if case and case.requires_sm else None) or self.requires_sm,
            modules=modules,
        )


@dataclass(frozen=True)
class Case:
    """One test of an external suite, concrete: its id, what it needs, and the adapter's payload.

    `skip` is set when the declaration itself rules the case out (disabled upstream);
    the runner adds the cell-dependent reasons (GPU count, accelerator, modules).
    """

    suite: str
    test_id: str
    requires: Requirements
    timeout: int
    spec: CaseSpec | None = None
    skip: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)


def _err(where: str, message: str) -> ConfigError:
    return ConfigError(message, where=where)


def _strings(value: Any, key: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _err(where, f"'{key}' must be a list of strings (got {value!r})")
    return tuple(value)


def _positive(value: Any, key: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _err(where, f"'{key}' must be a positive integer (got {value!r})")
    return value


def _env(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, (str, int)) for v in value.values()):
        raise _err(where, f"'env' must be a table of strings (got {value!r})")
    return {str(k): str(v) for k, v in value.items()}


def _accelerator(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if value not in ACCELERATORS:
        raise _err(where, f"'requires_accelerator' must be one of {', '.join(ACCELERATORS)} (got {value!r})")
    return value


def _check_keys(table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    import difflib

    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else f"; allowed: {', '.join(allowed)}"
            raise _err(where, f"unknown key '{key}'{hint}")


def _case(raw: Mapping[str, Any], where: str) -> CaseSpec:
    _check_keys(raw, CASE_KEYS, where)
    kind = raw.get("kind") or ("train" if "script" not in raw else "functions")
    if kind not in CASE_KINDS:
        raise _err(where, f"'kind' must be one of {', '.join(CASE_KINDS)} (got {kind!r})")
    if kind != "train" and not raw.get("script"):
        raise _err(where, f"a '{kind}' case needs 'script' (a path inside the upstream checkout)")
    if kind == "train" and not raw.get("name"):
        raise _err(where, "a 'train' case needs a 'name' (its test id is external/<suite>/integration::<name>)")
    rtol = raw.get("loss_rtol", 0.0)
    if not isinstance(rtol, (int, float)) or rtol < 0:
        raise _err(where, f"'loss_rtol' must be a non-negative number (got {rtol!r})")
    return CaseSpec(
        kind=kind,
        name=str(raw.get("name", "")),
        script=str(raw.get("script", "")),
        nproc=_positive(raw.get("nproc", 1), "nproc", where),
        args=_strings(raw.get("args", []), "args", where),
        functions=_strings(raw.get("functions", []), "functions", where),
        exclude=_strings(raw.get("exclude", []), "exclude", where),
        setup=raw.get("setup"),
        variant=str(raw.get("variant", "")),
        timeout=_positive(raw["timeout"], "timeout", where) if "timeout" in raw else None,
        env=_env(raw.get("env", {}), where),
        requires_accelerator=_accelerator(raw.get("requires_accelerator"), where),
        requires_sm=_positive(raw["requires_sm"], "requires_sm", where) if "requires_sm" in raw else None,
        requires_modules=_strings(raw.get("requires_modules", []), "requires_modules", where),
        expected_losses=raw.get("expected_losses"),
        loss_rtol=float(rtol),
        min_loss_steps=_positive(raw.get("min_loss_steps", 1), "min_loss_steps", where),
    )


def _suite(raw: Mapping[str, Any], where: str) -> SuiteSpec:
    _check_keys(raw, SUITE_KEYS, where)
    for required in ("name", "adapter", "package"):
        if not raw.get(required):
            raise _err(where, f"missing key '{required}'")
    if raw["adapter"] not in ADAPTER_KINDS:
        raise _err(where, f"'adapter' must be one of {', '.join(ADAPTER_KINDS)} (got {raw['adapter']!r})")
    cases_raw = raw.get("case", [])
    if not isinstance(cases_raw, list):
        raise _err(where, "'case' must be an array of tables ([[suite.case]])")
    cases = tuple(_case(c, f"{where} case #{i}") for i, c in enumerate(cases_raw, 1))
    for i, case in enumerate(cases, 1):
        if case.kind not in ADAPTER_KINDS[raw["adapter"]]:
            raise _err(f"{where} case #{i}", f"the {raw['adapter']} adapter runs cases of kind "
                       f"{' or '.join(ADAPTER_KINDS[raw['adapter']])}, not '{case.kind}'")
    by_group = raw.get("requires_sm_by_group", {})
    if not isinstance(by_group, dict):
        raise _err(where, "'requires_sm_by_group' must be a table of group = sm")
    return SuiteSpec(
        name=raw["name"],
        adapter=raw["adapter"],
        package=raw["package"],
        git=raw.get("git"),
        ref=str(raw.get("ref", "v{version}")),
        sdist=bool(raw.get("sdist", False)),
        keep=_strings(raw.get("keep", []), "keep", where),
        timeout=_positive(raw.get("timeout", 600), "timeout", where),
        env=_env(raw.get("env", {}), where),
        requires_accelerator=_accelerator(raw.get("requires_accelerator"), where),
        requires_sm=_positive(raw["requires_sm"], "requires_sm", where) if "requires_sm" in raw else None,
        requires_modules=_strings(raw.get("requires_modules", []), "requires_modules", where),
        upstream=_strings(raw.get("upstream", []), "upstream", where),
        requires_sm_by_group={str(k): _positive(v, f"requires_sm_by_group.{k}", where) for k, v in by_group.items()},
        cases=cases,
        where=where,
    )


def load_suites(path: str | Path = DEFAULT_PATH) -> list[SuiteSpec]:
    """Parse and check an external-suites file; any mistake is one ConfigError naming the suite."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("file not found; external suites are declared in suites/external.toml",
                          where=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}", where=str(path)) from None
    if data.get("schema") != SCHEMA:
        raise ConfigError(f"'schema' must be {SCHEMA} (found {data.get('schema')!r})", where=str(path))
    _check_keys(data, ("schema", "suite"), str(path))
    raw_suites = data.get("suite", [])
    if not isinstance(raw_suites, list):
        raise ConfigError("'suite' must be an array of tables ([[suite]])", where=str(path))
    suites = [_suite(s, f"{path}: [[suite]] #{i} ({s.get('name', '?')})") for i, s in enumerate(raw_suites, 1)]
    seen: set[str] = set()
    for s in suites:
        if s.name in seen:
            raise ConfigError(f"suite '{s.name}' is declared twice", where=s.where)
        seen.add(s.name)
    return suites


def suite_names(path: str | Path = CHECKOUT_SUITES) -> tuple[str, ...]:
    """The declared suites' names, for matrix.toml's `external` (distci.matrix.load_matrix's
    `external_names`); FileNotFoundError when the file is missing, so the matrix's error
    names the line that asked for them."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "no external suites file", str(path))
    return tuple(s.name for s in load_suites(path))
