"""GitHub Actions glue: the run's URL, step outputs, the step summary, a cell's runner facts.

Outside Actions (a local run, a test) the variables are absent and these write nothing,
so the same code path runs everywhere; the job-steps test sets them as a runner would.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Mapping

from distci.errors import SelectionError


def workflow_run_url(environ: Mapping[str, str] | None = None) -> str:
    """The URL of the current Actions run (empty outside Actions)."""
    env = os.environ if environ is None else environ
    server, repo, run = env.get("GITHUB_SERVER_URL"), env.get("GITHUB_REPOSITORY"), env.get("GITHUB_RUN_ID")
    return f"{server}/{repo}/actions/runs/{run}" if server and repo and run else ""


def append_step_summary(markdown: str) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(markdown)


_OUTPUT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def output_lines(values: Mapping[str, str]) -> str:
    """$GITHUB_OUTPUT text for `values`: `key=value`, or GitHub's heredoc form
    (`key<<DELIMITER` ... `DELIMITER`) for a value with a line break, with a random
    delimiter checked absent from the value. A value can never end its own entry and
    forge another key (a stored cell id with "\nconclusion=success" stays one value)."""
    out = []
    for key, value in values.items():
        if not _OUTPUT_NAME.fullmatch(key):
            raise ValueError(f"{key!r} is not a step output name (letters, digits, '_' and '-')")
        value = str(value)
        if "\n" not in value and "\r" not in value:
            out.append(f"{key}={value}\n")
            continue
        delimiter = f"ghadelimiter_{uuid.uuid4()}"
        while delimiter in value:  # pragma: no cover - a uuid4 in the value
            delimiter = f"ghadelimiter_{uuid.uuid4()}"
        out.append(f"{key}<<{delimiter}\n{value}\n{delimiter}\n")
    return "".join(out)


def write_outputs(values: Mapping[str, str]) -> str:
    """Appends `values` to $GITHUB_OUTPUT when set (see output_lines); returns the text for printing."""
    text = output_lines(values)
    path = os.environ.get("GITHUB_OUTPUT")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)
    return text


def default_remote(arg: str | None) -> str | None:
    """The history's git remote: the argument, else this repository in Actions, else none (a plain directory)."""
    if arg:
        return arg
    server, repo = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    return f"{server}/{repo}.git" if server and repo else None


def cell_outputs(cell_id: str, matrix_path: str | Path = "matrix.toml") -> dict[str, str]:
    """The runner labels and build facts of a cell, for $GITHUB_OUTPUT.

    bisect.yml runs on the runner the matrix declares for the cell; looking it up here
    keeps matrix.toml the only place runner labels are written.
    """
    from distci.matrix import load_matrix

    if any(c in cell_id for c in "*?["):
        raise SelectionError(f"a bisect runs on one cell; give its id, not a pattern: {cell_id!r}")
    cell = load_matrix(matrix_path).cell(cell_id)
    return {"cell": cell.id, "runner": json.dumps(list(cell.runner), separators=(",", ":")), "variant": cell.variant,
            "accelerator": cell.accelerator, "family": cell.family, "python": cell.python}
