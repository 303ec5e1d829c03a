"""Subcommands of the multi-node launch: what an admin or a workflow step runs by hand.

- `hosts-teardown`: remove simulated hosts a killed run left (namespaces named `distci-*`);
- `cluster-check --nodes N [--ranks-per-node M]`: the placement check on N simulated hosts;
- `trainjob [--cell ID] --image TAG [--submit]`: a cell's Kubernetes TrainJob (validated; JSON);
- `sbatch-script [--cell ID]`: a cell's Slurm batch script (`distci run` under DISTCI_HOSTS=slurm).
A command given no --cell takes the matrix's default multi-node cell (Matrix.default_cell).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("hosts-teardown", help="remove simulated hosts (network namespaces distci-*) a killed run left")
    p.add_argument("--force", action="store_true", help="also those of runs still going")
    p.set_defaults(fn=_cmd_teardown)
    p = sub.add_parser("cluster-check", help="run the multi-node placement check on simulated hosts")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=1)
    p.set_defaults(fn=_cmd_check)
    p = sub.add_parser("trainjob", help="print a multi-node cell's Kubernetes TrainJob (validated), or --submit it")
    p.add_argument("--cell", default=None, help="the multi-node cell (default: the matrix's first, CPU first)")
    p.add_argument("--image", required=True, help="the cell's image (nox -s images -- --cell ID)")
    p.add_argument("--namespace", default="default")
    p.add_argument("--submit", action="store_true", help="create it with the kubernetes client and wait for it")
    p.set_defaults(fn=_cmd_trainjob)
    p = sub.add_parser("sbatch-script", help="print a multi-node cell's Slurm batch script")
    p.add_argument("--cell", default=None, help="the multi-node cell (default: the matrix's first, CPU first)")
    p.add_argument("--tier", default="pr")
    p.add_argument("--workdir", default=".", help="the checkout on the cluster's shared filesystem")
    p.set_defaults(fn=_cmd_sbatch)


def _cmd_teardown(args: argparse.Namespace) -> int:
    from distci.launch.netns import teardown, unavailable

    reason = unavailable()
    if reason:
        print(f"hosts-teardown: nothing to do: {reason}", file=sys.stderr)
        return 0
    removed = teardown(force=args.force)
    print(f"hosts-teardown: removed {len(removed)} namespace(s){': ' + ', '.join(removed) if removed else ''}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from distci.launch.agents import run_program
    from distci.launch.netns import SimulatedHosts

    with SimulatedHosts(args.nodes) as hosts:
        exits = run_program(hosts, hosts.topology(args.ranks_per_node), ["-m", "distci.launch.check"])
    for e in exits:
        print(f"--- {e.hostname}: exit {e.returncode}\n{e.output.strip()}")
    return 0 if all(e.returncode == 0 for e in exits) else 1


def _cell(args: argparse.Namespace):
    from distci.matrix import load_matrix

    matrix = load_matrix(args.matrix)
    return matrix.cell(args.cell) if args.cell else matrix.default_cell(multi_node=True)


def _cmd_trainjob(args: argparse.Namespace) -> int:
    from distci.launch import k8s

    cell = _cell(args)
    run = time.strftime("%Y%m%dt%H%M%S", time.gmtime())
    manifest = k8s.trainjob(cell, args.image, run=run, namespace=args.namespace)
    k8s.validate(manifest)
    print(json.dumps(manifest, indent=1))
    if not args.submit:
        return 0
    k8s.submit(manifest)
    verdict = k8s.wait(manifest["metadata"]["name"], args.namespace)
    print(f"trainjob {manifest['metadata']['name']}: {verdict}")
    return 0 if verdict == "Complete" else 1


def _cmd_sbatch(args: argparse.Namespace) -> int:
    from distci.launch.slurm import batch_script

    cell = _cell(args)
    workdir = Path(args.workdir).resolve()
    command = ["python", "-m", "distci", "run", "--cell", cell.id, "--tier", args.tier]
    print(batch_script(cell.id, cell.nodes, command=command, workdir=workdir), end="")
    print(f"# submit: sbatch {shlex.quote(cell.id + '.sbatch')}", file=sys.stderr)
    return 0
