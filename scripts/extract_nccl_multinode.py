"""Extract public two-node all-reduce times for `python -m workflows.operators`: nccl-tests
`all_reduce_perf` logs that two repositories commit in their documentation, each one 16-rank
run (2 nodes x 8 GPUs, one MPI process per GPU: `nThread 1 nGpus 1`, `graph: 0`, so `eager`),
8 B - 8 GiB. Writes one file per source into workflows/data/operators/:

  all_reduce_oci.csv     github.com/oracle-quickstart/oci-hpc-oke, README.md at commit
                         1402938d (2024-02-13): two OCI BM.GPU4.8 nodes, 8x A100-SXM4-40GB
                         (NVLink 3 NVSwitch) each, RDMA cluster network (RoCE). Licence: UPL 1.0
                         as the LICENSE file on the repository's 5.1.8 branch states (commit
                         e11caac); its default branch carries no LICENSE file.
  all_reduce_a3mega.csv  github.com/lessizzmore/create-a3mega-ztan-fork,
                         ztan-NCCL-test-result.markdown at commit 346b825 (2025-04-02): two
                         Google Cloud A3 Mega VMs, 8x H100 80GB HBM3 each, GPUDirect-TCPXO over
                         Ethernet. The repository states no licence: the figures' provenance is
                         recorded here and in the file's header; no code is taken.

Ranks and nodes come from the log's `Rank N ... on HOST` lines (a multi-process run's header says
`nGpus 1`), the time is the in-place column (the 10th), in ms. Each log is read from a bare git
mirror at the commit named (default /work/.mirror/<owner>+<name>/repo).

    python scripts/extract_nccl_multinode.py [--mirrors DIR] [--out DIR]
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from extract_operators import OUT, write

RANK = re.compile(r"Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device")


@dataclass(frozen=True)
class Log:
    """One committed all_reduce_perf log and what its repository states about the run."""

    file: str  # the data file written
    repo: str  # owner/name on GitHub
    commit: str
    date: str
    path: str
    device: str  # the catalog's (or workflows/opdata.py's declared) device name
    licence: str
    about: tuple[str, ...]  # header lines: hardware and network as the source states them


LOGS = (
    Log("all_reduce_oci.csv", "oracle-quickstart/oci-hpc-oke",
        "1402938d8c77b586e20ec9d40849e2177feef411", "2024-02-13", "README.md", "A100-40G",
        "UPL 1.0 (Copyright (c) 2019 Oracle and/or its affiliates; the LICENSE file of the "
        "repository's 5.1.8 branch, commit e11caac; the default branch carries none)",
        ("two OCI BM.GPU4.8 bare-metal nodes, 8x NVIDIA A100-SXM4-40GB each (NVLink 3 NVSwitch), "
         "RDMA cluster network (RoCE, SR-IOV VFs); the README's A100 test manifest, Kubeflow "
         "MPI job",)),
    Log("all_reduce_a3mega.csv", "lessizzmore/create-a3mega-ztan-fork",
        "346b825ad3b527ffbd6ba511a09d39df08f04be0", "2025-04-02",
        "ztan-NCCL-test-result.markdown", "H100-SXM",
        "none stated by the repository (figures vendored with their provenance; no code taken)",
        ("two Google Cloud A3 Mega VMs, 8x NVIDIA H100 80GB HBM3 each (NVLink 4 NVSwitch), "
         "GPUDirect-TCPXO over Ethernet (the repository's README: a Debian image for "
         "GPUDirect-TCPXO)",)),
)


def parse(text: str) -> tuple[int, int, list[tuple[int, float]]]:
    """(ranks, nodes, [(bytes, in-place us)]) of one multi-process all_reduce_perf log."""
    ranks: dict[int, str] = {}
    out: list[tuple[int, float]] = []
    for line in text.splitlines():
        if m := RANK.search(line):
            ranks[int(m.group(1))] = m.group(2)
            continue
        f = line.split()
        if len(f) == 13 and f[0].isdigit() and f[4] == "-1":
            out.append((int(f[0]), float(f[9])))
    if not ranks or not out:
        raise ValueError("no `Rank N ... on HOST` lines or no data rows")
    if sorted(ranks) != list(range(len(ranks))):
        raise ValueError(f"ranks {sorted(ranks)} are not 0..n-1")
    return len(ranks), len(set(ranks.values())), out


def show(mirror: Path, commit: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(mirror), "show", f"{commit}:{path}"],
                          capture_output=True, text=True, check=True).stdout


def extract(log: Log, mirror: Path, out: Path) -> int:
    ranks, nodes, data = parse(show(mirror, log.commit, log.path))
    per_node = ranks // nodes
    write(out / log.file, [
        f"source: github.com/{log.repo} commit {log.commit} ({log.date}); path {log.path}; "
        f"licence {log.licence}",
        *log.about,
        f"one NCCL all_reduce (fp32 sum) over {ranks} ranks on {nodes} nodes ({per_node} per "
        "node): nccl-tests all_reduce_perf, one MPI process per GPU (nThread 1 nGpus 1), "
        "graph: 0 (launch eager), in-place time, mean ms of 20 iterations (cudaEvent)"],
        ["device", "ranks", "per_node", "bytes", "launch", "ms"],
        [[log.device, ranks, per_node, b, "eager", f"{us / 1e3:.6g}"] for b, us in data])
    return len(data)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    for log in LOGS:
        mirror = args.mirrors / log.repo.replace("/", "+") / "repo"
        try:
            n = extract(log, mirror, args.out)
        except (subprocess.CalledProcessError, FileNotFoundError, ValueError) as e:
            print(f"--mirrors {args.mirrors}: no readable copy of {log.repo} at "
                  f"{log.commit[:12]} ({e})", file=sys.stderr)
            return 2
        print(f"wrote {n} all-reduce rows to {args.out / log.file} ({log.repo} "
              f"{log.commit[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
