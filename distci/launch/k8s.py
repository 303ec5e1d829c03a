"""Kubernetes: a Kubeflow Trainer `TrainJob` generated from a cell, validated, submitted.

Why TrainJob (Kubeflow Trainer v2, `trainer.kubeflow.org/v1alpha1`) and not a bare JobSet
or the older PyTorchJob: it is the API a cluster that runs PyTorch jobs installs today
(Trainer builds the JobSet, its headless service and the per-node pods itself), it
carries the two numbers a cell has (`numNodes`, `numProcPerNode`), and its models are
published on PyPI (`kubeflow-trainer-api`, generated from Trainer's OpenAPI spec), so CI
validates what we generate against them; JobSet has no such package and PyTorchJob
belongs to the Training Operator v1 that Trainer v2 replaces.

Each node's container runs torchrun with the c10d rendezvous on the first node
(`$(PET_MASTER_ADDR)`, which Trainer's torch runtime sets on every node), the same
command as on every other engine (`topology.agent_command`), over the placement check
(`distci.launch.check`) or a program the caller gives. `submit` and `wait` use the
official `kubernetes` client (imported there: a cell env never needs it).
"""

from __future__ import annotations

import re
import time
from typing import Any

from distci.errors import DistciError
from distci.launch.topology import JOIN_TIMEOUT_S, RDZV_PORT

GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
RUNTIME = "torch-distributed"  # the ClusterTrainingRuntime Trainer ships for PyTorch
CHECK_PROGRAM = ("-m", "distci.launch.check")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class ManifestError(DistciError, ValueError):
    """A generated manifest that the published schema rejects, or bad input to generate one
    (a DistciError: the CLI prints it as one line, exit 2, never a traceback)."""


def job_name(cell_id: str, run: str) -> str:
    """A DNS-1035 name (<= 63 chars, lower case) made of the cell id and the run."""
    base = re.sub(r"[^a-z0-9-]+", "-", f"distci-{run}-{cell_id}".lower()).strip("-")
    return base[:63].rstrip("-")


def trainjob(cell: Any, image: str, *, run: str, namespace: str = "default", program: tuple[str, ...] = CHECK_PROGRAM,
             runtime: str = RUNTIME, cpu: str = "4", memory: str = "16Gi") -> dict[str, Any]:
    """The TrainJob of `cell` (a distci Cell: nodes, ranks_per_node, accelerator, id, fixes)."""
    name = job_name(cell.id, run)
    if not _NAME.fullmatch(name):
        raise ManifestError(f"cannot make a Kubernetes name of cell {cell.id!r} and run {run!r}")
    if not image:
        raise ManifestError("no image: build the cell's image first (`nox -s images -- --cell ID`) and pass its tag")
    command = [
        "python", "-m", "torch.distributed.run", f"--nnodes={cell.nodes}", f"--nproc-per-node={cell.ranks_per_node}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=$(PET_MASTER_ADDR):{RDZV_PORT}", f"--rdzv-id={name}",
        f"--rdzv-conf=join_timeout={int(JOIN_TIMEOUT_S)}", "--max-restarts=0", *program,
    ]
    resources: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if cell.accelerator == "cuda":
        resources["nvidia.com/gpu"] = str(cell.ranks_per_node)
    elif cell.accelerator == "npu":
        resources["huawei.com/Ascend910"] = str(cell.ranks_per_node)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "distci", "distci/run": run[:63]}},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {
                "image": image,
                "command": command,
                "numNodes": cell.nodes,
                "numProcPerNode": cell.ranks_per_node,
                "env": [{"name": "DISTCI_CELL", "value": cell.id},
                        {"name": "DISTCI_FIXES", "value": "all" if cell.fixes == "on" else "none"}],
                "resourcesPerNode": {"limits": resources, "requests": resources},
            },
        },
    }


def validate(manifest: dict[str, Any]) -> None:
    """Check `manifest` against the published Trainer models (`kubeflow-trainer-api`): every
    field has the schema's type, and nothing is lost on a round trip through the models (a
    misspelt key would be dropped: the models ignore what they do not know)."""
    try:
        from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob
    except ImportError:
        raise ManifestError("validating needs the published models: pip install kubeflow-trainer-api") from None
    if manifest.get("apiVersion") != f"{GROUP}/{VERSION}" or manifest.get("kind") != KIND:
        raise ManifestError(f"apiVersion/kind must be {GROUP}/{VERSION} {KIND}, got "
                            f"{manifest.get('apiVersion')} {manifest.get('kind')}")
    try:
        model = TrainerV1alpha1TrainJob.from_dict(manifest)
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError names the field
        raise ManifestError(f"the TrainJob schema rejects it: {exc}") from None
    lost = _lost(manifest, model.to_dict())
    if lost:
        raise ManifestError(f"fields the TrainJob schema does not have: {', '.join(lost)}")


def _lost(ours: Any, theirs: Any, where: str = "") -> list[str]:
    if isinstance(ours, dict):
        if not isinstance(theirs, dict):
            return [where or "."]
        return [p for k, v in ours.items() for p in _lost(v, theirs.get(k, _MISSING), f"{where}.{k}" if where else k)]
    if isinstance(ours, list):
        if not isinstance(theirs, list) or len(theirs) != len(ours):
            return [where]
        return [p for i, (a, b) in enumerate(zip(ours, theirs)) for p in _lost(a, b, f"{where}[{i}]")]
    return [] if ours == theirs else [where]


_MISSING = object()


def submit(manifest: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - needs a cluster
    """Create the TrainJob with the official client (kubeconfig, else in-cluster config)."""
    from kubernetes import client, config

    validate(manifest)
    try:
        config.load_kube_config()
    except config.ConfigException:
        config.load_incluster_config()
    api = client.CustomObjectsApi()
    return api.create_namespaced_custom_object(GROUP, VERSION, manifest["metadata"]["namespace"], PLURAL, manifest)


def wait(name: str, namespace: str, timeout_s: float = 3600.0) -> str:  # pragma: no cover - needs a cluster
    """Until the TrainJob is Complete or Failed (its condition's type), or `timeout_s`: 'Timeout'."""
    from kubernetes import client

    api = client.CustomObjectsApi()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        for cond in (job.get("status") or {}).get("conditions") or []:
            if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
                return cond["type"]
        time.sleep(10)
    return "Timeout"
