"""What runs inside the cell environment: one upstream test on one rank, and the probe.

The rank side is called through the harness's torchrun entry (distci.harness.torchrun_entry),
so an upstream function is classified exactly like a native test (assert vs exception,
pid file for stack dumps, per-rank report). Upstream scripts are loaded by path and not
as `__main__`, so their own "run every test" loop does not run; each of their test
functions gets its own launch, its own process group and its own Result.

Standard library only (plus torch, which the upstream code imports anyway): this runs
on every torch the matrix holds.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Sequence


def _load_script(script: str) -> Any:
    path = Path(script).resolve()
    for entry in (str(Path.cwd()), str(path.parent)):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    name = "_distci_upstream_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {script}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_function(script: str, function: str, setup: str | None = None) -> None:
    """Runs `function` of an upstream script, passing it what the script's `setup` returns."""
    module = _load_script(script)
    fn = getattr(module, function)
    if setup:
        fn(getattr(module, setup)())
    else:
        fn()
    print(f"distci-external: {function} returned", flush=True)


def _commit_of(dist: str) -> str | None:
    """The VCS commit pip recorded for a package installed from git (PEP 610 direct_url.json)."""
    from importlib import metadata

    try:
        raw = metadata.distribution(dist).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not raw:
        return None
    try:
        return json.loads(raw).get("vcs_info", {}).get("commit_id")
    except ValueError:
        return None


def probe(packages: Sequence[str], modules: Sequence[str]) -> dict[str, Any]:
    """The cell environment as the external runner needs it: the Stack, the upstream
    packages' versions and commits, and which required modules cannot be imported."""
    from importlib import metadata

    from distci import stack

    found: dict[str, Any] = {}
    for name in packages:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = None
        found[name] = {"version": version, "commit": _commit_of(name) if version else None}
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return {"stack": stack.capture(), "packages": found, "missing_modules": missing}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m distci.external.entry probe --packages a,b --modules x,y` prints the probe as JSON."""
    import argparse

    parser = argparse.ArgumentParser(prog="distci.external.entry")
    parser.add_argument("what", choices=("probe",))
    parser.add_argument("--packages", default="")
    parser.add_argument("--modules", default="")
    args = parser.parse_args(argv)
    split = lambda text: [p for p in text.split(",") if p]  # noqa: E731
    result = probe(split(args.packages), split(args.modules))
    sys.stdout.write("\n" + json.dumps(result, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
