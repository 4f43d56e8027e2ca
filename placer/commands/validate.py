"""`placer validate JOB.yaml...`: check job files; show roles, memory floors, minimum devices."""
from __future__ import annotations

import argparse
from typing import Any

from placer.calibration import load_calibration
from placer.candidates import memory_floor_gb, min_devices
from placer.catalog import Resolved, resolve
from placer.cli import emit_json
from placer.estimate import can_host
from placer.spec import load_job


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("jobs", nargs="+", metavar="JOB.yaml")
    p.add_argument("--calibration", help="calibration profile (YAML/JSON)")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def describe(res: Resolved, calib) -> dict[str, Any]:
    job = res.job
    roles = {}
    for role in job.roles():
        m = res.model_of(role)
        hosts = {}
        for pool in job.cluster.pools:
            if can_host(res, role, pool):
                hosts[pool.name] = min_devices(res, role, pool, calib)
        roles[role] = {"model": m.name if m else None,
                       "params_b": round(m.params() / 1e9, 3) if m else None,
                       "memory_floor_gb": round(memory_floor_gb(res, role), 3),
                       "min_devices": hosts}
    pools = {p.name: {"device": p.device, "kind": res.device_of(p).kind.value,
                      "devices": p.devices_per_node * p.nodes, "nodes": p.nodes}
             for p in job.cluster.pools}
    return {"name": job.name, "algorithm": job.algorithm.value, "samples": job.batch.samples,
            "mode": job.pipeline.mode, "objective": job.objective,
            "max_context": job.max_context, "pools": pools, "roles": roles}


def run(args: argparse.Namespace) -> int:
    calib = load_calibration(args.calibration)
    docs = [describe(resolve(load_job(path), path), calib) for path in args.jobs]
    if args.json:
        emit_json(docs[0] if len(docs) == 1 else docs)
        return 0
    for d in docs:
        print(f"{d['name']}: {d['algorithm']}, {d['samples']} samples/iteration, {d['mode']} mode, "
              f"objective {d['objective']}, longest context {d['max_context']} tokens")
        print("  pools: " + ", ".join(f"{n} ({p['devices']} x {p['device']})"
                                     for n, p in d["pools"].items()))
        print(f"  {'role':<12} {'model':<14} {'floor GB':>9}  min devices per pool")
        for role, r in d["roles"].items():
            hosts = ", ".join(f"{pool}: {'does not fit' if n is None else n}"
                              for pool, n in r["min_devices"].items()) or "no pool can host it"
            print(f"  {role:<12} {r['model'] or '-':<14} {r['memory_floor_gb']:>9.1f}  {hosts}")
    return 0
