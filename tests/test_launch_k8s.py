"""The Kubernetes TrainJob of a multi-node cell, checked against Kubeflow's published models."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from distci.launch.k8s import ManifestError, job_name, trainjob, validate
from distci.matrix import load_matrix

REPO = Path(__file__).resolve().parents[1]
pytest.importorskip("kubeflow_trainer_api", reason="the published TrainJob models: pip install kubeflow-trainer-api")


@pytest.fixture(scope="module")
def cells():
    return load_matrix(REPO / "matrix.toml").select(tier="multinode")


def test_every_multinode_cell_makes_a_valid_trainjob(cells) -> None:
    assert cells, "matrix.toml has no multinode cell"
    for cell in cells:
        manifest = trainjob(cell, "registry.example/distci-cpu:abc", run="20261206T0300Z-1a2b3c")
        validate(manifest)
        trainer = manifest["spec"]["trainer"]
        assert (trainer["numNodes"], trainer["numProcPerNode"]) == (cell.nodes, cell.ranks_per_node)
        assert "--rdzv-backend=c10d" in trainer["command"]
        assert f"--nproc-per-node={cell.ranks_per_node}" in trainer["command"]
        assert len(manifest["metadata"]["name"]) <= 63


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda m: m["spec"]["trainer"].update(numNodse=2), "does not have: spec.trainer.numNodse"),
    (lambda m: m["spec"]["trainer"].update(numNodes="2"), "numNodes"),
    (lambda m: m["spec"].pop("runtimeRef"), "runtimeRef"),
    (lambda m: m["spec"]["trainer"]["env"].append({"name": "X", "valu": "1"}), "spec.trainer.env[2].valu"),
    (lambda m: m.update(kind="PyTorchJob"), "apiVersion/kind must be trainer.kubeflow.org/v1alpha1 TrainJob"),
])
def test_the_schema_rejects_what_a_cluster_would(cells, edit, expected: str) -> None:
    manifest = copy.deepcopy(trainjob(cells[0], "registry.example/distci-cpu:abc", run="r"))
    edit(manifest)
    with pytest.raises(ManifestError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        validate(manifest)


def test_a_cuda_cell_asks_for_its_gpus_per_node(cells) -> None:
    import dataclasses

    cuda = dataclasses.replace(cells[-1], accelerator="cuda")
    manifest = trainjob(cuda, "registry.example/distci-cuda:abc", run="r")
    validate(manifest)
    assert manifest["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == str(cuda.ranks_per_node)


def test_names_fit_kubernetes_and_an_image_is_required(cells) -> None:
    assert job_name("cpu-cpu-torch_2.13.0-ao_0.18.0-ws4-n2-fix_on", "R" * 80).startswith("distci-rrr")
    with pytest.raises(ManifestError, match="no image"):
        trainjob(cells[0], "", run="r")

