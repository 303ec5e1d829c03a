"""The docker run backend: a cell's suites in a container of its image.

The container runs the same pytest command as a venv run (distci.run.cellrun), with the run
directory mounted at its own path, so results.jsonl, junit.xml and stack.json land where
a venv run puts them. The image id goes into the stack (``DISTCI_IMAGE_DIGEST``) and
run.json. Device access per family is `PROFILES`; on NPU runners the container joins the
host group that owns /dev/davinci* (`HwHiAiUser`, or DISTCI_NPU_DEVICE_GROUP).

Lifetime: every container carries the labels `distci.run` (the run id), `distci.cell`
and `distci.job` (the Actions job, from GITHUB_RUN_ID/GITHUB_RUN_ATTEMPT, or DISTCI_JOB).
SIGTERM or Ctrl-C stops the container (the harness inside turns SIGTERM into an
interrupted run with JUnit written) and removes it; what a SIGKILL leaves behind, the
always-run teardown step of the workflow removes by its labels (`distci teardown`).
Without a reachable daemon every selected cell gets an `infra` result, never a traceback.
"""

from __future__ import annotations

import glob
import grp
import json
import os
import shlex
import signal
import socket
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator

from distci.run.fitting import cell_tag
from distci.run.cellrun import absent_accelerator_run, cell_environment, finish_run, infra_run, pytest_command, start_run

from distci.rundir import CellRun, Selection
from distci.errors import ConfigError, InfraError, SourceError
from distci.images.base import connect
from distci.images.build import BuiltImage, ensure_image
from distci.images.npu import CANN_PROBE, check_cann
from distci.images.plan import family_of
from distci.cells import Cell, ContainerLimits
from distci.provision.selfwheels import REPO

Log = Callable[[str], None]

WORKDIR = PurePosixPath("/distci")
IMAGE_PYTHON = PurePosixPath("/venv/bin/python")
CONTAINER_FILE = "container.json"
STOP_TIMEOUT_S = 30
LABEL_RUN, LABEL_CELL, LABEL_JOB = "distci.run", "distci.cell", "distci.job"


@dataclass(frozen=True)
class RunProfile:
    """How a family's container reaches its devices (and nothing else)."""

    network_mode: str
    ipc_mode: str | None = None
    shm_size: str | None = None
    cap_add: tuple[str, ...] = ()
    memlock_unlimited: bool = False
    gpus: bool = False
    devices: tuple[str, ...] = ()
    required_device: str | None = None
    mounts: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # Host groups the container joins (by gid): the owners of the device nodes. The
    # variable overrides the default (comma separated; empty: none).
    device_groups: tuple[str, ...] = ()
    device_groups_var: str | None = None


PROFILES = {
    # No network at all: gloo rendezvous runs over loopback. SYS_PTRACE lets py-spy dump
    # the stacks of hung ranks.
    "cpu": RunProfile(network_mode="none", shm_size="2g", cap_add=("SYS_PTRACE",),
                      env=(("GLOO_SOCKET_IFNAME", "lo"),)),
    # Async TP (symmetric memory) and NCCL need host IPC and pinned memory; py-spy needs ptrace.
    "cuda": RunProfile(network_mode="host", ipc_mode="host", cap_add=("SYS_PTRACE",), memlock_unlimited=True,
                       gpus=True),
    # The devices and driver mounts Ascend documents for running CANN in a container; the
    # device nodes belong to HwHiAiUser (mode 660), which a non-root container user must join.
    "npu": RunProfile(network_mode="host", ipc_mode="host", cap_add=("SYS_PTRACE",), memlock_unlimited=True,
                      devices=("/dev/davinci[0-9]*", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"),
                      required_device="/dev/davinci[0-9]*",
                      mounts=("/usr/local/Ascend/driver", "/usr/local/dcmi", "/usr/local/bin/npu-smi",
                              "/etc/ascend_install.info"),
                      device_groups=("HwHiAiUser",), device_groups_var="DISTCI_NPU_DEVICE_GROUP"),
}


def device_gids(profile: RunProfile) -> list[int]:
    """The gids of the profile's device groups on this host (a name the host lacks is an InfraError)."""
    names = profile.device_groups
    if profile.device_groups_var and profile.device_groups_var in os.environ:
        names = tuple(n.strip() for n in os.environ[profile.device_groups_var].split(",") if n.strip())
    gids = []
    for name in names:
        if name.isdigit():
            gids.append(int(name))
            continue
        try:
            gids.append(grp.getgrnam(name).gr_gid)
        except KeyError:
            var = profile.device_groups_var or "the profile"
            raise InfraError(f"group {name!r} (owner of the device nodes) does not exist on this runner; "
                             f"set {var} to the group that owns them") from None
    return gids


def container_options(family: str, limits: ContainerLimits = ContainerLimits()) -> dict[str, Any]:
    """containers.run() keyword arguments for a family, confined by the accelerator's
    `limits` (matrix.toml): memory, pids, CPUs (capped at this host's count) and network.
    InfraError when the family's devices are absent here."""
    from docker.types import DeviceRequest, Ulimit

    profile = PROFILES[family]
    if profile.required_device and not glob.glob(profile.required_device):
        raise InfraError(f"no {profile.required_device} device on this runner: a {family} cell cannot run here")
    options: dict[str, Any] = {"network_mode": limits.network or profile.network_mode,
                               "cap_add": list(profile.cap_add)}
    if limits.memory:
        options["mem_limit"] = limits.memory
    if limits.pids:
        options["pids_limit"] = limits.pids
    if limits.cpus:
        options["nano_cpus"] = int(min(limits.cpus, os.cpu_count() or 1) * 1e9)
    if profile.ipc_mode:
        options["ipc_mode"] = profile.ipc_mode
    if profile.shm_size:
        options["shm_size"] = profile.shm_size
    if profile.memlock_unlimited:
        options["ulimits"] = [Ulimit(name="memlock", soft=-1, hard=-1)]
    if profile.gpus:
        options["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    devices = sorted({d for pattern in profile.devices for d in glob.glob(pattern)})
    if devices:
        options["devices"] = [f"{d}:{d}:rwm" for d in devices]
    gids = device_gids(profile)
    if gids:
        options["group_add"] = [str(g) for g in gids]
    mounts = {p: {"bind": p, "mode": "ro"} for p in profile.mounts if os.path.exists(p)}
    if mounts:
        options["volumes"] = mounts
    return options


def job_label(environ: dict[str, str] | None = None) -> str:
    """This job's identity on the runner: DISTCI_JOB, else the Actions run id and attempt, else `local`."""
    env = os.environ if environ is None else environ
    if env.get("DISTCI_JOB"):
        return env["DISTCI_JOB"]
    if env.get("GITHUB_RUN_ID"):
        return f"gh{env['GITHUB_RUN_ID']}-{env.get('GITHUB_RUN_ATTEMPT', '1')}"
    return "local"


def run_labels(run_id: str, cell_id: str) -> dict[str, str]:
    return {LABEL_RUN: run_id, LABEL_CELL: cell_id, LABEL_JOB: job_label()}


def checkout_mounts(tests: list[str]) -> dict[str, dict[str, str]]:
    """Test paths outside suites/ (an ad-hoc `--test tests/...`) are mounted read-only from the checkout."""
    mounts = {}
    for test in tests:
        top = PurePosixPath(test.split("::", 1)[0]).parts[0] if test else ""
        if top and top != "suites" and (REPO / top).exists():
            mounts[str(REPO / top)] = {"bind": str(WORKDIR / top), "mode": "ro"}
    return mounts


UNPRIVILEGED_USER = "65534:65534"
"""Who a cell's suites run as under a root controller (`user = "auto"`): nobody:nogroup."""


def container_user(limits: ContainerLimits = ContainerLimits()) -> str | None:
    """Who the container runs as (None: the image's default, root). "auto": the controller's
    uid:gid, so files in the mounted run directory stay the runner user's; under a root
    controller UNPRIVILEGED_USER (the run directory is handed to it, see `hand_over`)."""
    if limits.user == "root":
        return None
    if limits.user != "auto":
        return limits.user
    return UNPRIVILEGED_USER if os.geteuid() == 0 else f"{os.getuid()}:{os.getgid()}"


def hand_over(run_dir: Path, user: str | None) -> None:
    """Lets a container user other than the controller write the run directory (a root
    controller chowns it; anyone else already runs the container as itself)."""
    if user is None or os.geteuid() != 0:
        return
    uid, gid = (int(x) for x in user.split(":"))
    for root, dirs, files in os.walk(run_dir):
        for name in [".", *dirs, *files]:
            os.chown(os.path.join(root, name), uid, gid)


def _container_env(cell: Cell, tier: str | None, image: BuiltImage, family: str, user: str | None) -> dict[str, str]:
    env = {
        **cell_environment(cell, tier),
        **dict(PROFILES[family].env),
        "DISTCI_IMAGE_DIGEST": image.id,
        "DISTCI_IMAGE": image.tag,
        "DISTCI_RUNNER": os.environ.get("DISTCI_RUNNER") or socket.gethostname(),
        "PYTHONUNBUFFERED": "1",
    }
    if user is not None:  # a uid the image has no home (or passwd entry) for
        env.update(HOME="/tmp", USER="distci")
    return env


def _record_container(run_dir: Path, container) -> None:
    container.reload()
    host = container.attrs.get("HostConfig", {})
    keep = ("NetworkMode", "IpcMode", "ShmSize", "CapAdd", "Devices", "DeviceRequests", "Ulimits", "Binds",
            "GroupAdd", "Memory", "PidsLimit", "NanoCpus")
    (run_dir / CONTAINER_FILE).write_text(json.dumps({
        "id": container.id, "image": container.attrs.get("Config", {}).get("Image"),
        "image_id": container.attrs.get("Image"), "labels": container.labels,
        "host_config": {k: host.get(k) for k in keep}}, indent=1, sort_keys=True, default=str))


class Stopped(Exception):
    """The controller got SIGTERM (a cancelled or timed-out job): stop the container, record infra."""


@contextmanager
def sigterm_stops() -> Iterator[None]:
    """Within the block SIGTERM raises Stopped (so `finally` blocks run); outside it, as before."""
    def handler(signum: int, frame: Any) -> None:
        raise Stopped(f"stopped by signal {signal.Signals(signum).name}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_and_remove(container, log: Log, *, graceful: bool = True) -> None:
    """Stop (SIGTERM, then SIGKILL after STOP_TIMEOUT_S) and remove; `graceful=False` kills at once."""
    from docker.errors import DockerException

    if graceful:
        try:
            container.stop(timeout=STOP_TIMEOUT_S)
        except DockerException:
            pass
    try:
        container.remove(force=True)
    except DockerException as exc:
        log(f"could not remove container {container.short_id}: {exc}")


def probe_cann(client, image: BuiltImage, options: dict[str, Any]) -> str:
    """The CANN version a container of `image` sees (empty when none), read as the suites would."""
    volumes = options.get("volumes") or {}
    out = client.containers.run(image.tag, ["bash", "-c", CANN_PROBE], remove=True, user=container_user(),
                                volumes=volumes, network_mode="none", labels=run_labels("probe", image.tag))
    return out.decode("utf-8", "replace").strip()


def run_cell_in_docker(cell: Cell, client, *, runs_root: Path, tests: list[str] | None = None,
                       keyword: str | None = None, tier: str | None = None, shard: str | None = None,
                       log: Log = print) -> CellRun:
    """One run of a cell in its container: the venv run's pytest command, results through a mount."""
    from docker.errors import DockerException

    info, run_dir = start_run(cell, runs_root, tier=tier, backend="docker", log=log)
    try:
        family = family_of(cell)
        options = container_options(family, cell.container)  # no device, no build
        image = ensure_image(cell, client, log=log)
        if family == "npu":
            check_cann(image.labels.get("distci.cann.expected"), probe_cann(client, image, options), image=image.tag)
    except (InfraError, SourceError, ConfigError, DockerException) as exc:
        log(f"{cell_tag(cell.id)}infra: {exc}")
        return infra_run(cell, info, run_dir, exc, None)
    info.image, info.image_digest = image.tag, image.id
    info.selection = Selection(keyword, tuple(tests or ()), shard).to_list()
    cmd = pytest_command(cell, Path(IMAGE_PYTHON), run_dir, info.run_id, tests=tests or [],
                         keyword=keyword, extra_args=[], root=Path(WORKDIR), shard=shard)
    info.command = shlex.join(cmd)
    # The run directory is mounted at its own path, so paths the harness records (logs) hold outside too.
    volumes = {**options.pop("volumes", {}), **checkout_mounts(tests or []),
               str(run_dir): {"bind": str(run_dir), "mode": "rw"}}
    log(f"{cell_tag(cell.id)}$ docker run {image.tag} {info.command}")
    container = None
    user = container_user(cell.container)
    try:
        hand_over(run_dir, user)
    except OSError as exc:
        return infra_run(cell, info, run_dir, InfraError(f"cannot hand the run directory to the container's user "
                                                         f"{user} ({exc}); set user in matrix.toml's container table"),
                         None)
    try:
        with sigterm_stops():
            container = client.containers.run(image.tag, cmd, detach=True, working_dir=str(WORKDIR),
                                              user=user, volumes=volumes,
                                              environment=_container_env(cell, tier, image, family, user),
                                              labels=run_labels(info.run_id, cell.id), **options)
            _record_container(run_dir, container)
            _follow_logs(container, run_dir / "pytest.log", lambda line: log(f"{cell_tag(cell.id)}{line}"))
            code = container.wait().get("StatusCode")
    except Stopped as exc:
        log(f"{cell_tag(cell.id)}{exc}: stopping the container")
        if container is not None:
            _stop_and_remove(container, log)
            container = None
        run = finish_run(cell, info, run_dir, None)
        if not run.results:
            return infra_run(cell, info, run_dir, InfraError(f"the run was {exc} before any result"), None)
        return run
    except DockerException as exc:
        error = InfraError(f"container of {image.tag} failed to run: {' '.join(str(exc).split())[:300]}")
        log(f"{cell_tag(cell.id)}infra: {error}")
        return infra_run(cell, info, run_dir, error, None)
    finally:
        if container is not None:
            _stop_and_remove(container, log)
    return finish_run(cell, info, run_dir, code)


def _follow_logs(container, path: Path, log: Log) -> None:
    with open(path, "w") as out:
        pending = b""
        for chunk in container.logs(stream=True, follow=True):
            pending += chunk
            *done, pending = pending.split(b"\n")
            for raw in done:
                line = raw.decode("utf-8", "replace")
                out.write(line + "\n")
                log(line)
        if pending:
            out.write(pending.decode("utf-8", "replace") + "\n")


def run_cells_in_docker(cells: list[Cell], *, runs_root: Path, tests: list[str] | None = None,
                        keyword: str | None = None, tier: str | None = None, shard: str | None = None) -> list[CellRun]:
    """`python -m distci run --backend docker`: each cell's suites in its image."""
    try:
        client = connect()
    except InfraError as exc:
        print(f"distci: infra: {exc}", file=sys.stderr, flush=True)
        runs = []
        for cell in cells:
            info, run_dir = start_run(cell, runs_root, tier=tier, backend="docker", log=lambda m: None)
            runs.append(infra_run(cell, info, run_dir, exc, None))
        return runs
    return [absent_accelerator_run(cell, runs_root, tier=tier, backend="docker")
            or run_cell_in_docker(cell, client, runs_root=runs_root, tests=tests, keyword=keyword, tier=tier,
                                  shard=shard)
            for cell in cells]


@dataclass(frozen=True)
class Teardown:
    removed: list[str]
    selector: dict[str, str]


def teardown(client, *, job: str | None = None, cell: str | None = None, run: str | None = None,
             log: Log = print) -> Teardown:
    """Remove the containers of a job (and cell, or run): what a killed controller left behind."""
    selector = {LABEL_JOB: job or job_label()}
    if cell:
        selector[LABEL_CELL] = cell
    if run:
        selector[LABEL_RUN] = run
    found = client.containers.list(all=True, filters={"label": [f"{k}={v}" for k, v in selector.items()]})
    removed = []
    for container in found:
        log(f"teardown: removing container {container.short_id} ({container.labels.get(LABEL_CELL, '?')}, "
            f"run {container.labels.get(LABEL_RUN, '?')})")
        _stop_and_remove(container, log, graceful=False)  # its controller is gone: nobody reads its results
        removed.append(container.id)
    log(f"teardown: {len(removed)} container(s) of {', '.join(f'{k}={v}' for k, v in selector.items())} removed")
    return Teardown(removed=removed, selector=selector)
