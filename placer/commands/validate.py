"""`placer validate JOB.yaml...`: check job files; show roles, memory floors, minimum devices and,
for a training role whose smallest layouts need the optimizer offloaded, the host memory the
fewest-device one puts on one node beside the node's RAM (`placer.solve.hostmem.candidate_node`, the check
the planner makes before it refuses a candidate)."""
from __future__ import annotations

import argparse
from typing import Any

from placer.base.roles import Role
from placer.cli import emit_json
from placer.cost.calibration import load_calibration
from placer.cost.estimate import can_host
from placer.cost.pricer import Pricer
from placer.solve.candidates import Candidate, memory_floor_gb, role_candidates
from placer.solve.hostmem import candidate_node
from placer.spec.agentjob import agent_job
from placer.spec.agents import role_name
from placer.spec.catalog import Resolved, resolve
from placer.spec.judge import judge_max_context
from placer.spec.load import load_job


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("jobs", nargs="+", metavar="JOB.yaml")
    p.add_argument("--calibration", help="calibration profile (YAML/JSON)")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def describe(res: Resolved, calib) -> dict[str, Any]:
    if res.job.agents is not None:
        return describe_agents(res, calib)
    return _describe(res, calib)


def describe_agents(res: Resolved, calib) -> dict[str, Any]:
    """A multi-agent job: every agent's roles as `AGENT.ROLE`, each sized on the agent's own
    view of the episode (`placer.spec.agentjob.agent_job`), and what each agent is."""
    job = res.job
    assert job.agents is not None
    out = _describe(res, calib, roles=[])
    agents: dict[str, dict[str, Any]] = {}
    for name, a in job.agents.members.items():
        sub = _describe(resolve(agent_job(job, name)), calib, roles=job.agents.roles_of(name))
        out["roles"].update({role_name(name, r): v for r, v in sub["roles"].items()})
        shared = job.agents.shared_of(name)
        agents[name] = {
            "policy": a.policy, "trained": a.trained, "reward": a.reward,
            "turns": [i for i, t in enumerate(job.agents.turns) if t == name],
            "response_mean_tokens": round(job.response_of(name).mean_value(), 1),
            "max_context": sub["max_context"],
            "engines": ("own" if shared is None else
                        f"shared_engines.{shared} ({job.agents.shared_engines[shared].adapters})"),
            "roles": [role_name(name, r) for r in job.agents.roles_of(name)]}
    out["agents"] = agents
    out["turns"] = list(job.agents.turns)
    return out


def _describe(res: Resolved, calib, roles: list[Role] | None = None) -> dict[str, Any]:
    job = res.job
    out_roles: dict[str, dict[str, Any]] = {}
    roles_ = job.roles() if roles is None else roles
    for role in roles_:
        m = res.model_of(role)
        hosts: dict[str, int | None] = {}
        host_mem = {}
        for pool in job.cluster.pools:
            if can_host(res, role, pool):
                cands = role_candidates(Pricer(res, calib), role, pool, prune=False)
                hosts[pool.name] = min((c.devices for c in cands), default=None)
                if (need := _offload_host(res, cands)) is not None:
                    host_mem[pool.name] = need
        out_roles[role] = {"model": m.name if m else None,
                       "params_b": round(m.params() / 1e9, 3) if m else None,
                       "memory_floor_gb": round(memory_floor_gb(res, role), 3),
                       "min_devices": hosts, "offload_host_memory": host_mem}
    pools = {p.name: {"device": p.device, "kind": res.device_of(p).kind.value,
                      "devices": p.devices_per_node * p.nodes, "nodes": p.nodes}
             for p in job.cluster.pools}
    out = {"name": job.name, "algorithm": job.algorithm.value, "samples": job.batch.samples,
           "mode": job.pipeline.mode, "objective": job.objective,
           "max_context": job.max_context, "pools": pools, "roles": out_roles}
    judge = job.judge
    if judge is not None and judge.verdict is not None and Role.REWARD in out_roles:
        out_roles[Role.REWARD]["judge"] = {
            "rubric_tokens": judge.rubric_tokens,
            "verdict_mean_tokens": round(judge.verdict.mean_value(), 1),
            "longest_request_tokens": int(judge_max_context(job.max_context, judge))}
    if job.lengths.images_per_prompt:
        out["image_tokens_per_prompt"] = int(job.lengths.prompt.offset)
    return out


def _offload_host(res: Resolved, cands: list[Candidate]) -> dict[str, Any] | None:
    """Host memory per node of the fewest-device candidate that offloads its optimizer (None:
    none offloads, or the pool's host memory is not checked)."""
    offloading = [c for c in cands if c.est.par.offload]
    if not offloading:
        return None
    c = min(offloading, key=lambda c: (c.devices, c.time_s))
    node = candidate_node(res, c)
    if node is None:
        return None
    return {"devices": c.devices, "parts_gb": {k: round(v, 1) for k, v in node.parts.items()},
            "total_gb": round(node.total_gb, 1), "capacity_gb": node.capacity_gb,
            "fits": not node.over}


def run(args: argparse.Namespace) -> int:
    calib = load_calibration(args.calibration)
    docs = [describe(resolve(load_job(path), path), calib) for path in args.jobs]
    if args.json:
        emit_json(docs[0] if len(docs) == 1 else docs)
        return 0
    for d in docs:
        print(f"{d['name']}: {d['algorithm']}, {d['samples']} samples/iteration, {d['mode']} mode, "
              f"objective {d['objective']}, longest context {d['max_context']} tokens")
        if d.get("image_tokens_per_prompt"):
            print(f"  images: {d['image_tokens_per_prompt']} image tokens in every prompt "
                  "(counted in every context; the vision encoder runs in every pass)")
        print("  pools: " + ", ".join(f"{n} ({p['devices']} x {p['device']})"
                                     for n, p in d["pools"].items()))
        _print_agents(d)
        w = max([12, *(len(r) + 1 for r in d["roles"])])
        print(f"  {'role':<{w}} {'model':<14} {'floor GB':>9}  min devices per pool")
        for role, r in d["roles"].items():
            hosts = ", ".join(f"{pool}: {'does not fit' if n is None else n}"
                              for pool, n in r["min_devices"].items()) or "no pool can host it"
            print(f"  {role:<{w}} {r['model'] or '-':<14} {r['memory_floor_gb']:>9.1f}  {hosts}")
            for pool, h in r["offload_host_memory"].items():
                print(f"  {'':<{w}} {'':<14} {'':>9}  {_host_line(pool, h)}")
            if (j := r.get("judge")) is not None:
                print(f"  {'':<{w}} {'':<14} {'':>9}  generative judge: reads sample + "
                      f"{j['rubric_tokens']} rubric tokens, decodes a "
                      f"{j['verdict_mean_tokens']:g}-token verdict on average; longest request "
                      f"{j['longest_request_tokens']} tokens of KV per sequence")
    return 0


def _print_agents(d: dict[str, Any]) -> None:
    """A multi-agent job: the turn schedule, then one line per agent."""
    if "agents" not in d:
        return
    print(f"  turns: {' -> '.join(d['turns'])}")
    for name, a in d["agents"].items():
        turns = len(a["turns"])
        print(f"  agent {name}: {a['policy']}, {'trained' if a['trained'] else 'frozen'}, "
              f"{turns} turn{'s' if turns != 1 else ''} of {a['response_mean_tokens']:g} tokens "
              f"on average, longest context {a['max_context']} tokens, reward {a['reward']}, "
              f"engines {a['engines']}; roles {', '.join(a['roles'])}")


def _host_line(pool: str, h: dict[str, Any]) -> str:
    parts = ", ".join(f"{k.replace('_', ' ')} {v:,.1f}" for k, v in h["parts_gb"].items() if v)
    verdict = "" if h["fits"] else ": over, refused"
    n = h["devices"]
    return (f"{pool}: optimizer offloaded at {n} device{'s' if n != 1 else ''} needs {h['total_gb']:,.1f} "
            f"GB of host memory per node of {h['capacity_gb']:,.0f} ({parts}){verdict}")
