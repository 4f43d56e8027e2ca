"""The fleet file: many jobs, their teams, the teams' quotas and one cluster.

    name: fleet-mixed
    objective: throughput            # or makespan
    cluster: {pools: [...]}          # as a job's `cluster` (or a path to one)
    teams:
      research: {cohort: lab, quota: {h100: {nominal: 2, borrowing_limit: 1}}}
    jobs:
      - {name: grpo-a, team: research, job: grpo.yaml, weight: 2, iterations: 200}
      - {team: research, job: {name: ..., algorithm: ..., ...}}   # an inline job

Quotas are Kueue's: a team is a ClusterQueue, a pool a ResourceFlavor, and a quota counts whole
nodes of the pool. `nominal` is the ClusterQueue's nominalQuota; `borrowing_limit` its
borrowingLimit, "the maximum amount of quota ... this ClusterQueue is allowed to borrow from the
unused quota of other ClusterQueues in the same cohort" (kubernetes-sigs/kueue
apis/kueue/v1beta2/clusterqueue_types.go, ResourceQuota; site/content/en/docs/concepts/
cluster_queue.md, commit ff69552, v0.20.0-devel). As in Kueue, a team without a cohort borrows
nothing, a team with a cohort and no limit may borrow all of its cohort's unused quota, and a
team may use no pool its quota does not name. Kueue's lendingLimit is not modelled.

Every job is validated on the fleet's cluster (its own `cluster`, if any, is replaced), and every
mistake in the file is one line naming the job (or team) and the field: `load_fleet` raises one
`SpecErrors` with them all.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt, ValidationError

from placer.base.inputs import SpecErrors
from placer.fleet.contention import Contention, contention_errors
from placer.fleet.sharing import Shared, shared_errors
from placer.spec.base import PosFloat, PosInt, Strict
from placer.spec.catalog import devices_of
from placer.spec.errorlines import validation_lines
from placer.spec.hardware import Cluster, DeviceKind
from placer.spec.job import Job
from placer.spec.load import dump_job, job_from_dict, load_job, read_structured

# A job's weight is relative: the allocation scales the largest weighted rate to its objective's
# integer range (`placer.fleet.allocmodel.SCALE`, 1e9), so a weight a million times another's
# already leaves the lighter job a few units of it; beyond, it would weigh nothing (and a
# weight near the float range overflowed the scaling into a NaN).
MAX_WEIGHT = 1e6
Nodes = Annotated[StrictInt, Field(ge=0)]


class Quota(Strict):
    """A team's share of one pool, in whole nodes (Kueue's ResourceQuota of one flavor)."""

    nominal: Nodes = Field(description="nodes of the pool the team is guaranteed "
                                           "(Kueue nominalQuota)")
    borrowing_limit: Nodes | None = Field(
        None, description="most nodes beyond nominal the team may borrow from its cohort's "
                                "unused nominal quota (Kueue borrowingLimit; absent: no limit "
                                "inside a cohort; a team without a cohort borrows nothing)")


class Team(Strict):
    """A team: Kueue's ClusterQueue (and a LocalQueue its jobs are submitted to)."""

    cohort: str | None = Field(None, description="the teams that lend each other unused quota")
    quota: dict[str, Quota] = Field(description="pool name -> the team's quota there; a pool "
                                                "not named here is one the team cannot use")


class Deadline(Strict):
    """`iterations` iterations finished within `hours` of the fleet's start."""

    iterations: PosInt = Field(description="iterations to finish")
    hours: PosFloat = Field(description="hours to finish them in")


class FleetJob(Strict):
    """One job of the fleet."""

    name: str | None = Field(None, description="the job's name in the fleet; default: the "
                                               "job's own name")
    team: str = Field(description="the team (a key of `teams`) whose quota the job uses")
    job: str | dict[str, Any] = Field(description="a job file (path relative to the fleet "
                                                  "file) or an inline job mapping")
    weight: Annotated[float, Field(strict=True, gt=0, le=MAX_WEIGHT)] = Field(
        1.0, description="the job's weight in the weighted throughput (a higher priority is a "
                         "larger weight; at most a million)")
    iterations: PosInt | None = Field(None, description="iterations the job runs (needed by "
                                                        "the makespan objective)")
    deadline: Deadline | None = Field(None, description="finish this many iterations by then")
    min_iterations_per_hour: PosFloat | None = Field(
        None, description="the slowest the job may run, iterations per hour")


class FleetFile(Strict):
    """The fleet file, as written."""

    name: str = Field(description="the fleet's name")
    objective: Literal["throughput", "makespan"] = Field(
        "throughput", description="throughput: the weighted sum of iterations per hour; "
                                  "makespan: the time by which every job has run its iterations")
    cluster: dict[str, Any] | str = Field(description="the one cluster (a job file's `cluster` "
                                                      "section, or a path to one)")
    teams: dict[str, Team] = Field(min_length=1, description="team name -> its cohort and quota")
    jobs: list[FleetJob] = Field(min_length=1, description="the jobs to place")
    contention: Contention | None = Field(None, description="what the jobs share when "
                                                            "simulated side by side "
                                                            "(`placer fleet --simulate`)")
    shared: Shared | None = Field(None, description="CPU environment pools and rollout engines "
                                                    "several jobs share "
                                                    "(`placer.fleet.sharing`)")


@dataclass(frozen=True)
class FleetJobSpec:
    """A fleet job, validated: its job on the fleet's cluster."""

    name: str
    team: str
    job: Job
    weight: float
    iterations: int | None
    deadline: Deadline | None
    min_iterations_per_hour: float | None

    def max_iteration_s(self) -> float | None:
        """The slowest iteration the deadline and the minimum throughput allow (None: any)."""
        limits = []
        if self.deadline is not None:
            limits.append(self.deadline.hours * 3600 / self.deadline.iterations)
        if self.min_iterations_per_hour is not None:
            limits.append(3600 / self.min_iterations_per_hour)
        return min(limits) if limits else None


@dataclass(frozen=True)
class Fleet:
    """A validated fleet: the cluster, the teams and the jobs on it."""

    name: str
    objective: str
    cluster: Cluster
    teams: dict[str, Team]
    jobs: list[FleetJobSpec]
    contention: Contention | None = None
    shared: Shared | None = None

    def pool_nodes(self) -> dict[str, int]:
        return {p.name: p.nodes for p in self.cluster.pools}

    def team_cap(self, team: str, pool: str) -> int:
        """The most nodes of `pool` the team may hold: nominal plus what it may borrow."""
        q = self.teams[team].quota.get(pool)
        if q is None:
            return 0
        total = self.pool_nodes()[pool]
        if self.teams[team].cohort is None:
            return min(q.nominal, total)
        extra = total if q.borrowing_limit is None else q.borrowing_limit
        return min(q.nominal + extra, total)


def load_fleet(path: str | Path) -> Fleet:
    """Read and validate a fleet file; every mistake is one line of one `SpecErrors`."""
    return fleet_from_dict(read_structured(path), Path(path).parent, str(path))


def fleet_from_dict(data: dict[str, Any], base: Path, source: str = "fleet") -> Fleet:
    try:
        ff = FleetFile.model_validate(data)
    except ValidationError as e:
        raise SpecErrors(validation_lines(e, f"{source}: ", root=FleetFile)) from None
    errors: list[str] = []
    cluster = _cluster(ff, base, source, errors)
    if cluster is None:
        raise SpecErrors(errors)
    errors += _check_teams(ff, cluster, source)
    jobs = [_job(ff, i, cluster, base, source, errors) for i in range(len(ff.jobs))]
    errors = _cluster_once(errors, source)
    names = [j.name for j in jobs if j is not None]
    for n in sorted({n for n in names if names.count(n) > 1}):
        errors.append(f"{source}: jobs: job name {n!r} appears more than once (give each a "
                      f"`name`) (got {n!r})")
    if ff.contention is not None:
        errors += contention_errors(ff.contention, names, {t: list(v.quota)
                                                           for t, v in ff.teams.items()},
                                    {p.name: p.nodes for p in cluster.pools}, source)
    if ff.shared is not None:
        valid = [j for j in jobs if j is not None]
        errors += shared_errors(ff.shared, {j.name: j.job for j in valid},
                                {j.name: j.team for j in valid}, _pool_kinds(cluster, valid),
                                source)
        errors += _shared_twice(ff, source)
    if errors:
        raise SpecErrors(errors)
    return Fleet(ff.name, ff.objective, cluster, ff.teams, [j for j in jobs if j is not None],
                 ff.contention, ff.shared)


def _pool_kinds(cluster: Cluster, jobs: list[FleetJobSpec]) -> dict[str, DeviceKind | None]:
    """Each pool's device kind, from the device types a validated job reads the fleet's
    cluster with (its own catalog's, else the shipped ones); None when no job is valid (their
    errors are reported)."""
    devices = devices_of(jobs[0].job) if jobs else {}
    return {p.name: devices[p.device].kind if p.device in devices else None
            for p in cluster.pools}


def _shared_twice(ff: FleetFile, source: str) -> list[str]:
    """A job the allocation already shares a CPU pool for (`shared`) named again in the
    simulation's `contention.cpu_pools` (the allocation's sharing is simulated as it is)."""
    if ff.shared is None or ff.contention is None:
        return []
    allocated = {n for cp in ff.shared.cpu_pools for n in cp.jobs}
    return [f"{source}: contention.cpu_pools.{i}.jobs: job {n!r} shares a CPU pool in the "
            f"allocation (shared.cpu_pools), which the simulation shares too (got {n!r})"
            for i, cp in enumerate(ff.contention.cpu_pools) for n in cp.jobs if n in allocated]


def _cluster_once(errors: list[str], source: str) -> list[str]:
    """A mistake in the fleet's cluster shows in every job validated on it: one line, naming the
    cluster, not one per job."""
    out: list[str] = []
    for line in errors:
        head, sep, rest = line.partition(": job: cluster.")
        if sep and head.startswith(f"{source}: jobs."):
            line = f"{source}: cluster.{rest}"
        if line not in out:
            out.append(line)
    return out


def _cluster(ff: FleetFile, base: Path, source: str, errors: list[str]) -> Cluster | None:
    raw: Any = ff.cluster
    if isinstance(raw, str):
        try:
            raw = read_structured(base / raw)
        except SpecErrors as e:
            errors += [f"{source}: cluster: {line}" for line in e.lines]
            return None
        except ValueError as e:  # SpecError
            errors.append(f"{source}: cluster: {e}")
            return None
    try:
        return Cluster.model_validate(raw)
    except ValidationError as e:
        errors += validation_lines(e, f"{source}: cluster.", root=Cluster)
        return None


def _check_teams(ff: FleetFile, cluster: Cluster, source: str) -> list[str]:
    out = []
    pools = {p.name: p.nodes for p in cluster.pools}
    for team, t in ff.teams.items():
        for pool, q in t.quota.items():
            if pool not in pools:
                out.append(f"{source}: teams.{team}.quota.{pool}: no pool {pool!r} in the "
                           f"cluster (pools: {', '.join(pools)}) (got {pool!r})")
            elif t.cohort is None and q.borrowing_limit is not None:
                out.append(f"{source}: teams.{team}.quota.{pool}.borrowing_limit: a team without "
                           f"a cohort cannot borrow (as in Kueue) (got {q.borrowing_limit})")
    for pool, nodes in pools.items():
        nominal = sum(t.quota[pool].nominal for t in ff.teams.values() if pool in t.quota)
        if nominal > nodes:
            out.append(f"{source}: teams: the nominal quotas of pool {pool} add to {nominal} "
                       f"nodes; the pool has {nodes} (got {nominal})")
    return out


def _job(ff: FleetFile, i: int, cluster: Cluster, base: Path, source: str,
         errors: list[str]) -> FleetJobSpec | None:
    fj = ff.jobs[i]
    raw_name = fj.name or (fj.job.get("name") if isinstance(fj.job, dict) else Path(fj.job).stem)
    where = f"{source}: jobs.{i} ({raw_name})"
    before = len(errors)
    if fj.team not in ff.teams:
        errors.append(f"{where}: team: no team {fj.team!r} in teams (teams: "
                      f"{', '.join(ff.teams)}) (got {fj.team!r})")
    if ff.objective == "makespan" and fj.iterations is None:
        errors.append(f"{where}: iterations: the makespan objective needs every job's "
                      "iterations (got none)")
    job = _job_on(fj.job, cluster, base, where, errors)
    if job is None or len(errors) > before:
        return None
    if fj.name is not None:  # the job's plan and its exports carry the fleet's name for it
        job = job.model_copy(update={"name": fj.name})
    if not _folder_name(job.name):
        errors.append(f"{where}: {'name' if fj.name is not None else 'job: name'}: a fleet "
                      "job's name is its folder under `placer fleet --execute --out`: no '/', "
                      f"'\\' or NUL, not empty, '.' or '..' (got {job.name!r})")
        return None
    return FleetJobSpec(job.name, fj.team, job, fj.weight, fj.iterations,
                        fj.deadline, fj.min_iterations_per_hour)


def _folder_name(name: str) -> bool:
    """Whether `name` is one folder's name inside another (never a path out of it)."""
    return name not in ("", ".", "..") and not any(c in name for c in "/\\\0")


def _job_on(raw: str | dict[str, Any], cluster: Cluster, base: Path, where: str,
            errors: list[str]) -> Job | None:
    """The job validated on the fleet's cluster; its mistakes as lines under `where`."""
    fleet_cluster = cluster.model_dump(mode="json", exclude_unset=True)
    try:
        if isinstance(raw, str):
            data = dump_job(load_job(base / raw))  # its own paths anchored to its folder
        else:
            data = raw
        return job_from_dict({**data, "cluster": fleet_cluster}, "job")
    except SpecErrors as e:
        errors += [f"{where}: {line}" for line in e.lines]
    except ValueError as e:  # SpecError: an unreadable file, a plan given as a job
        errors.append(f"{where}: job: {e}")
    return None
