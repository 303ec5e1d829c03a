"""Stand-ins for the vendor tools docs/runners.md tells a runner admin to run (tests/test_runners_doc.py).

`python runnerstubs.py NAME ARGS...` records `NAME ARGS` in $DISTCI_STUB_LOG and fails
where the real tool would fail on these arguments. The GitHub runner's `config.sh` is
modelled on actions/runner (src/Runner.Common/Constants.cs: the options and flags it
accepts; ConfigurationManager.cs: a configured directory refuses a second registration,
`--unattended` needs `--url` and `--token`), plus one rule of ours: runner groups belong
to organizations and enterprises, so a repository registration never names one (the
runner ignores it there; the guide must not show a setting that does nothing).
`run.sh` and `svc.sh` need a configured directory. Others only record.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

CONFIG_ARGS = {"auth", "labels", "monitorsocketaddress", "name", "runnergroup", "startuptype", "url", "username",
               "windowslogonaccount", "work", "token", "pat", "windowslogonpassword", "jitconfig"}
CONFIG_FLAGS = {"check", "commit", "ephemeral", "generateserviceconfig", "help", "local", "no-default-labels",
                "replace", "disableupdate", "once", "runasservice", "unattended", "version"}
SETTINGS = Path(".runner")
GITHUB_URL = re.compile(r"^https://[\w.-]+/[\w.-]+(/[\w.-]+)?/?$")


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
    SETTINGS.write_text(json.dumps({"url": url, "labels": labels, "group": values.get("runnergroup", "Default"),
                                    "ephemeral": "ephemeral" in flags}))
    return 0


def needs_config(name: str) -> int:
    if not SETTINGS.exists():
        return fail("Not configured. Run config.(sh/cmd) to configure the runner.")
    return 0


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
    if name == "config.sh":
        return config(args)
    if name in ("run.sh", "svc.sh"):
        return needs_config(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
