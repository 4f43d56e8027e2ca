"""Extract a second public source of in-node all-reduce times for `python -m workflows.operators`:
nccl-tests `all_reduce_perf` logs committed to github.com/waynehacking8/nccl-collectives-bench
(MIT licence; one 8x H100 80GB SXM5 NVSwitch host, all pairs NV18). Writes
workflows/data/operators/all_reduce_nccl_tests.csv.

Unlike Vidur's profiles (rank 0's NCCL kernel, timed by kineto in a burst of eager calls), an
nccl-tests line is the mean wall time of 50 back-to-back collectives over cudaEvents, launched
by one thread that drives every GPU (`nThread 1 nGpus N`). Two launch modes are kept:

  eager  each iteration launches the collective on every GPU from the host (`graph: 0`): at small
         sizes the host's launch of N kernels, not the GPU, sets the pace (the ~23 us floor the
         repository reports), as in Vidur's host-bound kernels
  graph  the iterations are captured in a CUDA graph and replayed (`-G 1`, `graph: 1`): the GPU
         runs them back to back, so a line is the collective itself, as a step that issues its
         collectives ahead of the GPU (or replays a graph, as vLLM's decode does) pays it

The logs, each a full table whose rows are `size count type redop root` then out-of-place and
in-place `time algbw busbw #wrong`:

  results/quiet/all_reduce.txt                 4 ranks, eager, 8 B .. 8 GiB (a quiet-box re-run)
  results/scaling.txt                          2 and 6 ranks, eager, 256 MiB .. 8 GiB (the 4-rank
                                               block repeats the quiet run's sizes: left out)
  results/symmetric/all_reduce_reg0_graph1.txt 4 ranks, CUDA graph, 8 B .. 16 MiB, no buffer
                                               registration (the `-R 2` symmetric-memory runs are
                                               a non-default NCCL feature: left out)

The kept time is the in-place column (a TP all-reduce, torch.distributed.all_reduce, is in
place), in ms. NCCL version: the quiet and graph logs' headers say `nccl-library=22902` (NCCL
2.29.2; their `nccl-tests version 2.18.3` is the benchmark's own version); the repository's
report states NCCL 2.18.3 for the scaling run, whose log has no header.

    python scripts/extract_nccl_tests.py [--source PATH] [--out DIR]

PATH is a checkout or bare git mirror of the repository (read at HEAD; default
/work/.mirror/waynehacking8+nccl-collectives-bench/repo).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from extract_operators import OUT, write

REPO = "github.com/waynehacking8/nccl-collectives-bench"
DEVICE = "H100-SXM"  # the catalog's name for "NVIDIA H100 80GB HBM3" on an NV18 NVSwitch host
PER_NODE = 8
# (path, launch mode, rank counts kept or None for the log's own, that log's NCCL statement)
LOGS = (("results/quiet/all_reduce.txt", "eager", None),
        ("results/scaling.txt", "eager", (2, 6)),
        ("results/symmetric/all_reduce_reg0_graph1.txt", "graph", None))
BLOCK = re.compile(r"^### GPUS=(\d+)")
HEADER = re.compile(r"nGpus (\d+) .* graph: (\d+)")


def parse(text: str, ranks: int | None = None) -> list[tuple[int, int, float]]:
    """(ranks, bytes, in-place us) of every data row of an all_reduce_perf log; `ranks` from
    the `nGpus` header or a `### GPUS=N` block marker (scaling.txt), else the argument."""
    out = []
    for line in text.splitlines():
        if m := BLOCK.match(line):
            ranks = int(m.group(1))
            continue
        if m := HEADER.search(line):
            ranks = int(m.group(1))
            continue
        f = line.split()
        if len(f) == 13 and f[0].isdigit() and f[4] == "-1":
            if ranks is None:
                raise ValueError(f"a data row before any rank count: {line.strip()!r}")
            out.append((ranks, int(f[0]), float(f[9])))
    return out


def show(src: Path, rel: str) -> str:
    if (src / rel).is_file():
        return (src / rel).read_text()
    return subprocess.run(["git", "-C", str(src), "show", f"HEAD:{rel}"], capture_output=True,
                          text=True, check=True).stdout


def head_commit(src: Path) -> tuple[str, str]:
    """The mirror's HEAD commit and its date (YYYY-MM-DD), for a data file's provenance line."""
    git = ["git", "-C", str(src), "log", "-1", "--format=%H %cs"]
    commit, date = subprocess.run(git, capture_output=True, text=True, check=True).stdout.split()
    return commit, date


def rows(src: Path) -> list[list[object]]:
    out: list[list[object]] = []
    for rel, launch, keep in LOGS:
        for ranks, nbytes, us in parse(show(src, rel)):
            if keep is None or ranks in keep:
                out.append([DEVICE, ranks, PER_NODE, nbytes, launch, f"{us / 1e3:.6g}"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--source", type=Path,
                    default=Path("/work/.mirror/waynehacking8+nccl-collectives-bench/repo"))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    try:
        commit, date = head_commit(args.source)
        data = rows(args.source)
    except (subprocess.CalledProcessError, FileNotFoundError, ValueError) as e:
        print(f"--source {args.source}: not a copy of {REPO} ({e})", file=sys.stderr)
        return 2
    write(args.out / "all_reduce_nccl_tests.csv", [
        f"source: {REPO} commit {commit} ({date}); licence MIT (Copyright (c) 2026 Wei Cheng "
        "(Wayne) Chiu)",
        "paths: " + " ".join(rel for rel, _, _ in LOGS),
        "one NCCL all_reduce (fp32 sum) inside one 8x H100 80GB SXM5 NVSwitch host: nccl-tests "
        "all_reduce_perf, in-place time, mean ms of 50 back-to-back iterations (cudaEvent);",
        "launch eager: host-launched each iteration (graph: 0); graph: captured in a CUDA graph "
        "(-G 1); ranks: nGpus of one thread; per_node: the host's GPUs;",
        "NCCL 2.29.2 (nccl-library=22902) in the quiet and graph logs, 2.18.3 as the repository "
        "states for scaling.txt (2 and 6 ranks kept; 4 ranks: the quiet log)"],
        ["device", "ranks", "per_node", "bytes", "launch", "ms"], data)
    print(f"wrote {len(data)} all-reduce rows to {args.out} ({REPO} {commit[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
