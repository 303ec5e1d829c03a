"""A small GitHub Actions job runner for tests/test_job_steps.py: runs a workflow's jobs here.

It runs what a workflow file says, the way a runner does: jobs in `needs` order, each
matrix leg whose `runs-on` this machine serves, every `run:` step through
`bash --noprofile --norc -eo pipefail` with GitHub's environment (GITHUB_*, RUNNER_*,
the workflow's, job's and step's `env:`), `$GITHUB_OUTPUT` / `$GITHUB_ENV` / `$GITHUB_PATH`
/ `$GITHUB_STEP_SUMMARY` files, step `if:` conditions (success() by default) and
`continue-on-error`. Steps run as `user` (through runuser when the test is root).

`uses:` steps are GitHub's own actions; the few the workflows use are done here with the
same effect (checkout: the working-tree copy is the workspace; upload/download-artifact
and upload-pages-artifact: directories), and any other action is recorded with its
evaluated inputs (`Step.inputs`) instead of run: the relay callback needs an OIDC token
only GitHub can mint. An expression this runner cannot evaluate is an error: the
workflows must stay simple enough for it, which is the point of keeping them thin.

`Cancel` cancels a job during one of its steps, as the Cancel button does: the step's
processes get SIGINT, then SIGTERM after the runner's 7.5 s grace, then SIGKILL; the
job's status becomes `cancelled`, so only steps whose `if:` holds then (`always()`,
`cancelled()`) still run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}", re.S)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Variables of the machine a runner passes on to its jobs (proxy, pip configuration).
PASS_THROUGH = re.compile(r"^(PIP_[A-Z_]+|https?_proxy|HTTPS?_PROXY|no_proxy|NO_PROXY|DOCKER_HOST)$")


class ExpressionError(Exception):
    pass


@dataclass
class Cancel:
    """Cancel job `job` while its step `step` runs, once `when(RUNNER_TEMP)` holds."""

    job: str
    step: str
    when: Callable[[Path], bool]
    grace_s: float = 7.5  # the runner's wait between SIGINT and SIGTERM
    timeout_s: float = 900.0  # the step ending first, or this, without `when`: no cancel happened
    kill_at_once: bool = False  # SIGKILL with no grace: a runner that dies rather than cancels


class Ctx(dict):
    """A context object: `a.b` and `a['b-c']` both read keys; a missing key is '' (as in Actions: null)."""

    def __getattr__(self, name: str) -> Any:
        return wrap(self.get(name, ""))

    def __getitem__(self, name: str) -> Any:
        return wrap(self.get(name, ""))


def wrap(value: Any) -> Any:
    if isinstance(value, dict) and not isinstance(value, Ctx):
        return Ctx(value)
    return value


def _to_python(expr: str) -> str:
    """An Actions expression as Python: operators and literals outside the '...' strings."""
    parts = re.split(r"('(?:[^']|'')*')", expr)
    return "".join(part if i % 2 else _code_to_python(part) for i, part in enumerate(parts))


def _code_to_python(out: str) -> str:
    out = re.sub(r"\.([A-Za-z_][\w]*(?:-[\w-]+)+)", lambda m: f"[{m.group(1)!r}]", out)  # a.b-c -> a['b-c']
    out = out.replace("&&", " and ").replace("||", " or ")
    out = re.sub(r"!(?!=)", " not ", out)
    out = re.sub(r"\btrue\b", "True", out)
    out = re.sub(r"\bfalse\b", "False", out)
    out = re.sub(r"\bnull\b", "None", out)
    return out


@dataclass
class Step:
    name: str
    kind: str  # run | uses | skipped
    rc: int = 0
    output: str = ""
    cancelled: bool = False
    outputs: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class Job:
    key: str
    leg: dict[str, Any]
    result: str  # success | failure | cancelled | skipped | no-runner
    steps: list[Step] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)
    temp: Path | None = None  # its RUNNER_TEMP

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)


class Runner:
    """Runs one workflow's jobs on this machine for a `workflow_dispatch` event."""

    def __init__(self, workflow: Path, workspace: Path, root: Path, *, user: str | None, labels: set[str],
                 inputs: dict[str, str], variables: dict[str, str], env: dict[str, str],
                 cancel: Cancel | None = None, env_override: dict[str, str] | None = None) -> None:
        self.wf = yaml.safe_load(workflow.read_text())
        self.workflow_file = workflow.name
        self.workspace = workspace
        self.root = root
        self.user = user
        self.labels = labels
        self.inputs = inputs
        self.vars = variables
        self.base_env = env
        self.cancel = cancel
        self.env_override = dict(env_override or {})  # set after the workflow's env (a test machine's indexes)
        self.artifacts = root / "artifacts"
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.jobs: dict[str, list[Job]] = {}
        self.run_id = str(int(time.time()))

    # ------------------------------------------------------------------ expressions

    def evaluate(self, expr: str, ctx: dict[str, Any]) -> Any:
        status = ctx.get("__status__", "success")
        functions = {
            "success": lambda: status == "success", "failure": lambda: status == "failure",
            "always": lambda: True, "cancelled": lambda: status == "cancelled",
            "fromJSON": json.loads, "toJSON": json.dumps,
            "format": lambda f, *a: re.sub(r"\{(\d+)\}", lambda m: str(a[int(m.group(1))]), f),
            "hashFiles": lambda *a: "0" * 64,
        }
        names = {k: wrap(v) for k, v in ctx.items() if not k.startswith("__")}
        try:
            return eval(_to_python(expr), {"__builtins__": {}}, {**functions, **names})  # noqa: S307 - test code
        except Exception as exc:  # noqa: BLE001 - any failure is the expression's
            raise ExpressionError(f"cannot evaluate ${{{{ {expr} }}}}: {exc}") from None

    def render(self, value: Any, ctx: dict[str, Any]) -> Any:
        if not isinstance(value, str):
            return value
        whole = EXPR.fullmatch(value.strip())
        if whole:
            return self.evaluate(whole.group(1), ctx)
        return EXPR.sub(lambda m: _text(self.evaluate(m.group(1), ctx)), value)

    def condition(self, cond: Any, ctx: dict[str, Any], default: str = "success()") -> bool:
        text = default if cond is None else str(cond)
        text = EXPR.sub(lambda m: m.group(1), text) if "${{" in text else text
        if not re.search(r"\b(success|failure|always|cancelled)\(\)", text):
            text = f"success() && ({text})"
        return bool(self.evaluate(text, ctx))

    # ------------------------------------------------------------------ jobs

    def github(self, job_key: str) -> dict[str, Any]:
        return {"event_name": "workflow_dispatch", "ref": "refs/heads/distci-test", "ref_name": "distci-test",
                "repository": self.base_env["GITHUB_REPOSITORY"], "run_id": self.run_id, "run_attempt": "1",
                "server_url": self.base_env["GITHUB_SERVER_URL"], "token": "", "job": job_key,
                "workspace": str(self.workspace), "workflow": self.wf.get("name", ""),
                "event": {"repository": {"default_branch": "main"}, "inputs": self.inputs}}

    def needs_ctx(self, job: dict[str, Any]) -> dict[str, Any]:
        needs = job.get("needs", [])
        needs = [needs] if isinstance(needs, str) else needs
        ctx = {}
        for name in needs:
            legs = self.jobs.get(name, [])
            results = {leg.result for leg in legs}
            result = next((r for r in ("failure", "cancelled", "success") if r in results), "skipped")
            outputs = legs[0].outputs if len(legs) == 1 else {}
            ctx[name] = {"result": result, "outputs": outputs}
        return ctx

    def run_all(self) -> dict[str, list[Job]]:
        pending = dict(self.wf["jobs"])
        while pending:
            ready = [k for k, j in pending.items()
                     if all(n in self.jobs for n in ([j["needs"]] if isinstance(j.get("needs"), str)
                                                     else j.get("needs", [])))]
            assert ready, f"jobs whose needs never finish: {sorted(pending)}"
            for key in ready:
                self.jobs[key] = self.run_job(key, pending.pop(key))
        return self.jobs

    def run_job(self, key: str, job: dict[str, Any]) -> list[Job]:
        needs = self.needs_ctx(job)
        ctx = {"github": self.github(key), "inputs": self.inputs, "vars": self.vars, "needs": needs,
               "env": {}, "matrix": {}, "strategy": {}, "steps": {}, "runner": {}, "job": {}}
        upstream_failed = any(n["result"] != "success" for n in needs.values())
        ctx["__status__"] = "failure" if upstream_failed else "success"
        if not self.condition(job.get("if"), ctx):
            return [Job(key, {}, "skipped")]
        matrix = job.get("strategy", {}).get("matrix")
        legs = [{}]
        if matrix is not None:
            rendered = self.render(matrix, ctx)
            legs = list(rendered.get("include", [])) if isinstance(rendered, dict) else []
        return [self.run_leg(key, job, dict(ctx, matrix=leg), leg) for leg in legs]

    def run_leg(self, key: str, job: dict[str, Any], ctx: dict[str, Any], leg: dict[str, Any]) -> Job:
        runs_on = self.render(job["runs-on"], ctx)
        wanted = set(runs_on if isinstance(runs_on, list) else [runs_on])
        if not wanted <= self.labels:
            return Job(key, leg, "no-runner")
        temp = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=self.root))
        self._own(temp)
        ctx = dict(ctx, runner={"temp": str(temp), "name": "distci-test-runner", "os": "Linux"})
        env = {**self.base_env, "RUNNER_TEMP": str(temp), "GITHUB_RUN_ID": self.run_id, "GITHUB_JOB": key}
        for level in (self.wf.get("env") or {}, job.get("env") or {}):
            env.update({k: _text(self.render(v, dict(ctx, env=env))) for k, v in level.items()})
        env.update(self.env_override)
        result = Job(key, leg, "success", temp=temp)
        steps_ctx: dict[str, Any] = {}
        status = "success"
        path_extra: list[str] = []
        for i, step in enumerate(job.get("steps", [])):
            name = step.get("name") or step.get("uses") or f"step {i}"
            sctx = dict(ctx, env=env, steps=steps_ctx, __status__=status)
            if not self.condition(step.get("if"), sctx):
                result.steps.append(Step(name, "skipped"))
                continue
            files = {v: temp / f"_{v.lower()}_{i}" for v in ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH",
                                                             "GITHUB_STEP_SUMMARY")}
            for f in files.values():
                f.write_text("")
                self._own(f)
            senv = {**env, **{k: str(v) for k, v in files.items()},
                    **{k: _text(self.render(v, sctx)) for k, v in (step.get("env") or {}).items()}}
            senv["PATH"] = ":".join([*reversed(path_extra), env.get("PATH", SYSTEM_PATH)])
            started = time.monotonic()
            cancel = self.cancel if self.cancel and (self.cancel.job, self.cancel.step) == (key, name) else None
            if "run" in step:
                done = self.run_script(step["run"], senv, sctx, name, cancel)
            else:
                done = self.use(step, sctx, name)
            done.seconds = time.monotonic() - started
            done.outputs = _read_outputs(files["GITHUB_OUTPUT"])
            env.update(_read_outputs(files["GITHUB_ENV"]))
            path_extra += [p for p in files["GITHUB_PATH"].read_text().splitlines() if p.strip()]
            result.steps.append(done)
            if "id" in step:
                steps_ctx[step["id"]] = {"outputs": done.outputs,
                                         "outcome": "success" if done.rc == 0 else "failure"}
            if done.cancelled:
                status = "cancelled"
            elif done.rc != 0 and not step.get("continue-on-error") and status == "success":
                status = "failure"
        result.result = status
        result.outputs = {k: _text(self.render(v, dict(ctx, steps=steps_ctx)))
                          for k, v in (job.get("outputs") or {}).items()}
        return result

    # ------------------------------------------------------------------ steps

    def _own(self, path: Path) -> None:
        if self.user and os.geteuid() == 0:
            shutil.chown(path, self.user, self.user)

    def run_script(self, script: str, env: dict[str, str], ctx: dict[str, Any], name: str,
                   cancel: Cancel | None = None) -> Step:
        text = self.render(script, ctx)
        fd, path = tempfile.mkstemp(suffix=".sh", dir=env["RUNNER_TEMP"])
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        self._own(Path(path))
        cmd = ["bash", "--noprofile", "--norc", "-eo", "pipefail", path]
        if self.user and os.geteuid() == 0:
            cmd = ["runuser", "-u", self.user, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()], *cmd]
            env = None  # runuser's `env -i` gives the step its environment
        if cancel is not None:
            return _cancelled_step(cmd, self.workspace, env, name, cancel, Path(ctx["runner"]["temp"]))
        proc = subprocess.run(cmd, cwd=self.workspace, capture_output=True, text=True, env=env)
        return Step(name, "run", proc.returncode, proc.stdout + proc.stderr)

    def use(self, step: dict[str, Any], ctx: dict[str, Any], name: str) -> Step:
        action = step["uses"].split("@", 1)[0]
        inputs = {k: _text(self.render(v, ctx)) for k, v in (step.get("with") or {}).items()}
        done = Step(name, "uses", inputs=inputs)
        if action in ("actions/checkout", "actions/setup-python"):
            return done  # the workspace is the checkout; the runner's python3 is used
        if action in ("actions/upload-artifact", "actions/upload-pages-artifact"):
            dest = self.artifacts / inputs.get("name", "github-pages")
            src = Path(inputs["path"].strip())
            if src.exists():
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(src, dest)
            return done
        if action == "actions/download-artifact":
            target = Path(inputs["path"])
            if "name" in inputs:
                found = [self.artifacts / inputs["name"]]
                if not found[0].is_dir():
                    done.rc, done.output = 1, f"Artifact not found: {inputs['name']}"
                    return done
                pairs = [(found[0], target)]
            else:
                pattern = re.compile(re.escape(inputs.get("pattern", "*")).replace(r"\*", ".*") + "$")
                pairs = [(d, target / d.name) for d in sorted(self.artifacts.iterdir()) if pattern.match(d.name)]
            for src, dest in pairs:
                shutil.copytree(src, dest, dirs_exist_ok=True)
            subprocess.run(["chown", "-R", f"{self.user}:{self.user}", str(target)], check=False) \
                if self.user and os.geteuid() == 0 and target.exists() else None
            return done
        return done  # any other action: recorded, not run


def _cancelled_step(cmd: list[str], cwd: Path, env: dict[str, str] | None, name: str, cancel: Cancel,
                    temp: Path) -> Step:
    """Runs a step and cancels it once `cancel.when` holds: SIGINT, SIGTERM, SIGKILL to its processes."""
    log = temp / f"_cancel_{os.getpid()}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + cancel.timeout_s
        while proc.poll() is None and not cancel.when(temp) and time.monotonic() < deadline:
            time.sleep(0.5)
        cancelled = proc.poll() is None and cancel.when(temp)
        if cancelled:
            ladder = ((signal.SIGKILL, 10.0),) if cancel.kill_at_once else \
                ((signal.SIGINT, cancel.grace_s), (signal.SIGTERM, 2.5), (signal.SIGKILL, 10.0))
            for sig, wait in ladder:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return Step(name, "run", proc.returncode, log.read_text(errors="replace"), cancelled=cancelled)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _read_outputs(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and "=" not in line.split("<<", 1)[0]:
            key, delim = line.split("<<", 1)
            body = []
            i += 1
            while i < len(lines) and lines[i] != delim:
                body.append(lines[i])
                i += 1
            out[key] = "\n".join(body)
        elif "=" in line:
            key, value = line.split("=", 1)
            out[key] = value
        i += 1
    return out
