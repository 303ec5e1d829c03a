"""Stand-ins for the vendor tools docs/runners.md tells a runner admin to run (tests/test_runners_doc.py).

`python runnerstubs.py NAME ARGS...` records `NAME ARGS` in $DISTCI_STUB_LOG and fails
where the real tool would fail on these arguments. The GitHub runner's `config.sh` is
modelled on actions/runner (src/Runner.Common/Constants.cs: the options and flags it
accepts; ConfigurationManager.cs: a configured directory refuses a second registration,
`--unattended` needs `--url` and `--token`), plus one rule of ours: runner groups belong
to organizations and enterprises, so a repository registration never names one (the
runner ignores it there; the guide must not show a setting that does nothing).

GitHub itself is a JSON file, $DISTCI_STUB_GITHUB (`Fleet`): a clock, the registration
tokens it issued (valid one hour), the just-in-time configurations (each usable once),
the queued jobs (their `runs-on` labels) and the jobs runners took. `run.sh` reads the
runner directory's `.env` when it starts (as Runner.Listener does), then takes jobs whose
labels its runner has: an ephemeral or just-in-time runner one job, then it unregisters;
a long-lived one until the queue has none for it. Each job cleans the checkout as
actions/checkout does (`git clean -ffdx`), uses the wheelhouse the job's environment
names (DISTCI_WHEELHOUSE_ROOT, else `.distci/wheelhouse` in the checkout), and takes
JOB_SECONDS of the clock, so a registration token kept across jobs expires. With no job
for it, run.sh exits IDLE (a real one would wait). `gh api` answers the registration-token
and generate-jitconfig calls; `systemctl link` / `enable --now` runs a unit's ExecStart
again and again as Restart=always does, until it is idle or fails StartLimitBurst times.
`svc.sh start` runs the long-lived runner. Other tools only record.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


CONFIG_ARGS = {"auth", "labels", "monitorsocketaddress", "name", "runnergroup", "startuptype", "url", "username",
               "windowslogonaccount", "work", "token", "pat", "windowslogonpassword", "jitconfig"}
CONFIG_FLAGS = {"check", "commit", "ephemeral", "generateserviceconfig", "help", "local", "no-default-labels",
                "replace", "disableupdate", "once", "runasservice", "unattended", "version"}
SETTINGS = Path(".runner")
GITHUB_URL = re.compile(r"^https://[\w.-]+/[\w.-]+(/[\w.-]+)?/?$")
DEFAULT_LABELS = ["self-hosted", "linux", "x64"]  # what config.sh adds; a just-in-time runner gets none
TOKEN_SECONDS = 3600
JOB_SECONDS = 45 * 60
IDLE = 75  # run.sh with no job for its runner (the real one would wait for one)
START_LIMIT_BURST = 5
CHECKOUT = Path("_work") / "distci" / "distci"


@contextmanager
def fleet() -> Iterator[dict]:
    """GitHub's side, read and written under a lock (the walk runs one command at a time,
    but a unit's loop and its script are separate processes). The lock is flock(2) itself,
    as filelock's Unix lock is: a stub is a process per vendor command (hundreds a test
    file), and importing filelock was ~40% of each one's start (0.10 -> 0.06 CPU-s a call)."""
    path = Path(os.environ["DISTCI_STUB_GITHUB"])
    with open(str(path) + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        state = json.loads(path.read_text())
        yield state
        path.write_text(json.dumps(state, indent=1))


def new_fleet(path: Path, jobs: list[list[str]], tokens: tuple[str, ...] = ()) -> None:
    """A fake GitHub with `jobs` queued (each its runs-on labels) and `tokens` issued now."""
    path.write_text(json.dumps({"clock": 0, "tokens": {t: 0 for t in tokens}, "jit": {}, "queue": jobs,
                                "taken": [], "units": {}}))


def fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 1


def config(args: list[str]) -> int:
    if args[:1] == ["remove"]:
        SETTINGS.unlink(missing_ok=True)
        return 0
    values: dict[str, str] = {}
    flags: set[str] = set()
    unknown = []
    i = 0
    while i < len(args):
        name = args[i][2:].lower() if args[i].startswith("--") else None
        if name in CONFIG_ARGS and i + 1 < len(args):
            values[name] = args[i + 1]
            i += 2
            continue
        if name in CONFIG_FLAGS:
            flags.add(name)
        else:
            unknown.append(args[i])
        i += 1
    if unknown:
        return fail(f"Unrecognized command-line input arguments: '{', '.join(unknown)}'")
    if SETTINGS.exists():
        return fail("Cannot configure the runner because it is already configured. To reconfigure the runner, "
                    "run './config.sh remove' first.")
    if "unattended" in flags:
        for needed in ("url", "token"):
            if not values.get(needed):
                return fail(f"--{needed} is required with --unattended")
    url = values.get("url", "")
    if not GITHUB_URL.match(url):
        return fail(f"--url {url!r} is not a repository, organization or enterprise URL")
    if url.rstrip("/").count("/") == 4 and "runnergroup" in values:
        return fail("runner groups exist only for organizations and enterprises: a repository registration "
                    "takes no --runnergroup")
    labels = values.get("labels", "")
    if labels and not all(label.strip() for label in labels.split(",")):
        return fail(f"--labels {labels!r} has an empty label")
    if os.environ.get("DISTCI_STUB_GITHUB"):
        with fleet() as gh:
            issued = gh["tokens"].get(values.get("token", ""))
            if issued is None or gh["clock"] - issued > TOKEN_SECONDS:
                return fail("Http response code: NotFound from 'POST .../actions/runner-registration' "
                            "(the registration token is unknown or expired: they last one hour)")
    given = [x.strip() for x in labels.split(",") if x.strip()]
    SETTINGS.write_text(json.dumps({"url": url, "labels": DEFAULT_LABELS + given, "group": values.get("runnergroup", "Default"),
                                    "ephemeral": "ephemeral" in flags}))
    return 0


def gh(args: list[str]) -> int:
    """`gh api -X POST SCOPE/actions/runners/(registration-token|generate-jitconfig) -f/-F ... --jq ...`."""
    if args[:1] != ["api"] or "-X" not in args:
        return 0
    if not os.environ.get("GH_TOKEN"):
        return fail("gh: To use GitHub CLI in automation, set the GH_TOKEN environment variable.")
    endpoint = next(a for a in args[1:] if "/actions/runners/" in a)
    if not re.fullmatch(r"(repos/[\w.-]+/[\w.-]+|orgs/[\w.-]+)/actions/runners/[\w-]+", endpoint):
        return fail(f"gh: Not Found (HTTP 404): {endpoint}")
    fields: dict[str, list[str]] = {}
    for flag, value in zip(args, args[1:]):
        if flag in ("-f", "-F", "--raw-field", "--field"):
            key, _, val = value.partition("=")
            fields.setdefault(key, []).append(val)
    with fleet() as state:
        if endpoint.endswith("/registration-token"):
            token = f"REG{len(state['tokens'])}"
            state["tokens"][token] = state["clock"]
            print(token)
            return 0
        if not endpoint.endswith("/generate-jitconfig"):
            return fail(f"gh: Not Found (HTTP 404): {endpoint}")
        for needed in ("name", "runner_group_id", "labels[]"):
            if needed not in fields:
                return fail(f"gh: Invalid input: object is missing required key: {needed.rstrip('[]')} (HTTP 422)")
        encoded = base64.b64encode(json.dumps({"name": fields["name"][0], "labels": fields["labels[]"],
                                               "n": len(state["jit"])}).encode()).decode()
        state["jit"][encoded] = "unused"
    print(encoded)
    return 0


def _dotenv() -> dict[str, str]:
    path = Path(".env")
    if not path.exists():
        return {}
    pairs = [line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#")]
    return {k.strip(): v.strip() for k, v in pairs}


def _take_job(runner: str, labels: list[str], env: dict[str, str]) -> bool:
    """One job for a runner with `labels`, if the queue holds one: the checkout cleaned,
    the wheelhouse used, the clock moved on."""
    have = {x.lower() for x in labels}
    with fleet() as state:
        i = next((i for i, job in enumerate(state["queue"]) if {x.lower() for x in job} <= have), None)
        if i is None:
            return False
        job = state["queue"].pop(i)
        if CHECKOUT.exists():
            shutil.rmtree(CHECKOUT)  # actions/checkout: git clean -ffdx of the previous job's checkout
        CHECKOUT.mkdir(parents=True)
        wheelhouse = Path(env.get("DISTCI_WHEELHOUSE_ROOT") or CHECKOUT / ".distci" / "wheelhouse").expanduser()
        warm = (wheelhouse / "torch.whl").exists()
        wheelhouse.mkdir(parents=True, exist_ok=True)
        (wheelhouse / "torch.whl").write_text("a wheel")
        state["taken"].append({"job": job, "runner": runner, "labels": labels, "clock": state["clock"],
                               "env": sorted(k for k in env if k.startswith(("DISTCI_", "HTTPS_PROXY"))),
                               "warm": warm})
        state["clock"] += JOB_SECONDS
    return True


def run(args: list[str]) -> int:
    env = {**_dotenv()}
    if args[:1] == ["--jitconfig"]:
        with fleet() as state:
            if state["jit"].get(args[1]) != "unused":
                return fail("The runner registration has been deleted from the server (a just-in-time "
                            "configuration is used once)")
            state["jit"][args[1]] = "used"
        jit = json.loads(base64.b64decode(args[1]))
        return 0 if _take_job(jit["name"], jit["labels"], env) else IDLE
    if not SETTINGS.exists():
        return fail("Not configured. Run config.(sh/cmd) to configure the runner.")
    if not os.environ.get("DISTCI_STUB_GITHUB"):
        return 0
    settings = json.loads(SETTINGS.read_text())
    took = 0
    while _take_job(str(Path.cwd()), settings["labels"], env):
        took += 1
        if settings["ephemeral"]:
            SETTINGS.unlink()  # one job, then the runner unregisters
            return 0
    return 0 if took else IDLE


def svc(args: list[str]) -> int:
    if not SETTINGS.exists():
        return fail("Not configured. Run config.(sh/cmd) to configure the runner.")
    if args[:1] == ["start"]:
        rc = run([])
        return 0 if rc in (0, IDLE) else rc
    return 0


def systemctl(args: list[str]) -> int:
    """`link UNIT_FILE` remembers a unit; `enable --now NAME@INSTANCE.service` runs its
    ExecStart as Restart=always does (HOME and PATH of the caller: the walk's user)."""
    if not os.environ.get("DISTCI_STUB_GITHUB") or not args:
        return 0
    if args[0] == "link":
        path = Path(args[1])
        if not path.is_file():
            return fail(f"Failed to link unit: No such file or directory ({path})")
        with fleet() as state:
            state["units"][path.name] = {"file": str(path), "state": "linked"}
        return 0
    if args[0] != "enable" or "--now" not in args:
        return 0
    unit = args[-1]
    template = re.sub(r"@[^.]+\.", "@.", unit)
    with fleet() as state:
        known = state["units"].get(template) or state["units"].get(unit)
    if not known:
        return fail(f"Failed to enable unit: Unit file {unit} does not exist.")
    instance = unit.split("@", 1)[1].rsplit(".", 1)[0] if "@" in unit else ""
    service = _unit_service(Path(known["file"]), instance)
    if service.get("Restart") != "always":
        return fail(f"{unit}: the stub models Restart=always units only")
    failures = starts = 0
    while starts < 200 and failures < START_LIMIT_BURST:
        starts += 1
        rc = subprocess.run(shlex.split(service["ExecStart"]), cwd=os.environ["HOME"]).returncode
        if rc == IDLE:
            break
        failures = failures + 1 if rc else 0
    with fleet() as state:
        state["units"][unit] = {"file": known["file"], "starts": starts,
                                "state": "failed" if failures >= START_LIMIT_BURST else "idle"}
    return 0


def _unit_service(path: Path, instance: str) -> dict[str, str]:
    keys: dict[str, str] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            keys[key] = value.replace("%i", instance)
    return keys


def sudo(args: list[str]) -> int:
    env = dict(os.environ)
    while args and re.fullmatch(r"[A-Za-z_]\w*=.*", args[0]):
        key, _, value = args.pop(0).partition("=")
        env[key] = value
    if not args:
        return fail("usage: sudo command")
    os.execvpe(args[0], args, env)
    return 1


def main(argv: list[str]) -> int:
    name, args = Path(argv[0]).name, argv[1:]
    if name == "sudo":
        return sudo(args)
    log = os.environ.get("DISTCI_STUB_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(" ".join([name, *args]) + "\n")
    tools = {"config.sh": config, "run.sh": run, "svc.sh": svc, "gh": gh, "systemctl": systemctl}
    return tools[name](args) if name in tools else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
