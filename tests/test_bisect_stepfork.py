"""The compiler bisect's step template (distci.bisect.stepfork): a forked step sees what a
new process would, and only commands it can run as `python SCRIPT` are forked."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from distci.bisect import stepfork
from distci.bisect.compiler import PER_STEP, SHIM, SHIM_ENV, _run_text


@pytest.mark.parametrize("command, argv", [
    ("python repro.py", ["python", "repro.py"]),
    ("python3 sub/repro.py --steps 3", ["python3", "sub/repro.py", "--steps", "3"]),
    (["sh", "-c", "python3.11 repro.py a=1"], ["python3.11", "repro.py", "a=1"]),
    ("python -m pytest test_x.py", None),  # a module, not a script: a new process
    ("python -X importtime repro.py", None),
    ("torchrun --nproc-per-node 2 repro.py", None),
    ("python repro.py > out.txt", None),  # the shell's: redirection, pipes, variables, quoting
    ("python repro.py | tee log", None),
    ("python $SCRIPT", None),
    ("python 'my repro.py'", None),
    ("A=1 python repro.py", None),
    ("python", None),
    (["python", "repro.py"], None),  # an argv is the driver's only as `sh -c STRING`
])
def test_only_a_plain_python_script_command_is_forkable(command, argv):
    assert stepfork.forkable(command) == argv


def test_a_step_whose_environment_differs_beyond_the_per_step_variables_runs_anew(tmp_path):
    (tmp_path / "repro.py").write_text("")
    started = {"PATH": str(Path(sys.executable).parent), "HOME": "/h"}
    request = {"argv": ["python", "repro.py"], "cwd": str(tmp_path), "env": dict(started)}
    assert stepfork.refusal(request, started, PER_STEP) is None
    bisect = dict(started, TORCH_BISECT_BACKEND="inductor", **{SHIM_ENV: "bisect"})
    assert stepfork.refusal(dict(request, env=bisect), started, PER_STEP) is None
    # torch reads such variables at import: the template's import would not be the step's
    changed = dict(started, TORCHINDUCTOR_FX_GRAPH_CACHE="0")
    assert "TORCHINDUCTOR_FX_GRAPH_CACHE" in stepfork.refusal(dict(request, env=changed), started, PER_STEP)
    assert "HOME" in stepfork.refusal(dict(request, env={"PATH": started["PATH"]}), started, PER_STEP)
    other = dict(started, PATH=str(tmp_path))  # another environment's python: not the template's
    (tmp_path / "python").write_text("#!/bin/sh\n")
    (tmp_path / "python").chmod(0o755)
    assert "not the template's interpreter" in stepfork.refusal(dict(request, env=other), {**started, **other},
                                                                   PER_STEP)
    assert "not a file" in stepfork.refusal(dict(request, argv=["python", "gone.py"]), started, PER_STEP)


PROBE = """\
import json
import os
import sys

warm = "torch" in sys.modules
import torch
from torch._inductor.compiler_bisector import CompilerBisector

first = not hasattr(torch, "_probe_was_here")  # a step's changes must not reach the next
torch._probe_was_here = True
print(json.dumps({
    "warm": warm, "first": first, "name": __name__, "argv": sys.argv, "path0": sys.path[0],
    "cwd": os.getcwd(), "enabled": CompilerBisector.bisection_enabled,
    "backend": CompilerBisector.get_backend(), "subsystem": CompilerBisector.get_subsystem(),
    "shimmed": hasattr(torch.compile, "__wrapped__"),
    "env": {k: os.environ.get(k) for k in %r},
}))
if sys.argv[1:] == ["raise"]:
    raise RuntimeError("the probe raised")
sys.exit(int(sys.argv[1]))
""" % (list(PER_STEP),)


@pytest.mark.slow
def test_a_forked_step_sees_what_a_new_process_sees(tmp_path):
    """The probe, forked and as a new process, under the environments a bisect gives its
    steps: the bisector's state from the environment (read at torch's import, redone in the
    fork), from its status file with no variable set, and with none; its exit code and
    failure text; and nothing of an earlier fork in the next."""
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "sub" / "probe.py").write_text(PROBE)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    cache = tmp_path / "inductor"
    env = {k: v for k, v in os.environ.items() if k not in PER_STEP}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               TORCHINDUCTOR_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join((str(shim), str(Path(stepfork.__file__).parents[2]))))
    template = stepfork.Template.start(sys.executable, env, work, tmp_path, per_step=PER_STEP, shim_env=SHIM_ENV)
    try:
        assert template.ready() is None, template.log_path.read_text()
        steps = str(template.socket_path)
        on = dict(env, TORCH_BISECT_BACKEND="aot_eager", TORCH_COMPILE_BACKEND="aot_eager",
                  TORCH_BISECT_SUBSYSTEM="decomposition", **{SHIM_ENV: "bisect"})
        status = cache / "bisect" / "bisect_status.txt"
        # the third case, the bisect off, is the template's own state: its fork is not
        # compared with a new process (~4 CPU-s), only checked below
        cases = [(on, "sub/probe.py 3", None, True),
                 (env, "sub/probe.py raise", "backend=inductor\nsubsystem=\n", True),
                 (env, "sub/probe.py 0", None, False)]
        seen_by_case = []
        for step_env, args, status_text, compare in cases:
            status.parent.mkdir(parents=True, exist_ok=True)
            status.unlink(missing_ok=True)
            if status_text:
                status.write_text(status_text)
            runs = [_run_text(f"python {args}", work, step_env, 300, steps)]
            if compare:
                runs.append(_run_text(f"python {args}", work, step_env, 300))
            seen = [json.loads(next(line for line in text.splitlines() if line.startswith("{"))) for _, text in runs]
            assert [s.pop("warm") for s in seen] == [True, False][:len(runs)]  # the fork is the template's
            said = [[line for line in text.splitlines() if not line.startswith("{")][-1] for _, text in runs]
            assert all(s == seen[0] for s in seen) and {code for code, _ in runs} == {runs[0][0]}, (args, runs)
            assert all(line == said[0] for line in said), (args, runs)
            seen_by_case.append((runs[0][0], seen[0]))
        # what each step saw: the bisect on from the environment, from the file, off
        assert [(code, s["enabled"], s["backend"], s["subsystem"], s["shimmed"]) for code, s in seen_by_case] == [
            (3, True, "aot_eager", "decomposition", True), (1, True, "inductor", None, False),
            (0, False, None, None, False)]
        assert all(s["first"] and s["name"] == "__main__" for _, s in seen_by_case)
        assert seen_by_case[0][1]["path0"] == str(work / "sub") and seen_by_case[0][1]["argv"] == ["sub/probe.py", "3"]
        # a step that outlives its timeout is ended, with what it started
        (work / "hang.py").write_text("import subprocess, sys, time\n"
                                      "child = subprocess.Popen(['sleep', '300'])\n"
                                      "open('hang.pid', 'w').write(str(child.pid))\n"
                                      "time.sleep(300)\n")
        began = time.monotonic()
        assert _run_text("python hang.py", work, env, 5, steps)[0] == 124
        assert time.monotonic() - began < 60
        left = int((work / "hang.pid").read_text())
        time.sleep(0.5)
        assert not Path(f"/proc/{left}").exists() or "Z" in Path(f"/proc/{left}/stat").read_text().split(")")[1][:3]
    finally:
        template.stop()


def test_a_template_that_cannot_serve_leaves_every_step_a_new_process(tmp_path):
    from distci.bisect.compiler import _template

    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no torch here')\n")
    env = {"PATH": os.environ["PATH"],
           "PYTHONPATH": os.pathsep.join((str(tmp_path / "site"), str(Path(stepfork.__file__).parents[2])))}
    said: list[str] = []
    assert _template("python repro.py", sys.executable, env, tmp_path, tmp_path, said.append) is None
    text = " ".join(line.strip() for line in said)
    assert text == ("compiler bisector: every step a new process: stepfork: not serving: torch does not "
                    "import (no torch here)"), said
    assert all(len(line) <= 80 for line in said)
    before = len(said)
    assert _template("torchrun repro.py", sys.executable, env, tmp_path, tmp_path, said.append) is None
    assert len(said) == before  # nothing to fork: no template started, nothing said
