"""Extract the all-reduce tables of github.com/stas00/ml-engineering (Stas Bekman's "Machine
Learning Engineering Open Book"; CC BY-SA 4.0, LICENSE-CC-BY-SA) for
`python -m workflows.operators`: H200 and B200 nodes and a 4-node B200 cluster, which no other
source here measures. From network/README.md, four tables, each found by the sentence that
introduces it:

  torch  all_reduce_bench.py (the book's torch.distributed benchmark: one process per GPU, one
         `dist.all_reduce` after a barrier timed by cudaEvents, 20 iterations; eager), torch 2.9.1,
         NCCL 2.27.7, 32 KiB-16 GiB:
           one 8x H200 SXM node (NVLink 4, NVSwitch), 8 ranks;
           AWS P6-B200 nodes (8x B200, NVLink 5; 8x 50 GB/s EFA v4 out), 1 node of 8 ranks and
           4 nodes of 32 ranks
  nccl   nccl-tests at 8 GiB, 4-8 ranks of one node, NCCL's default choice (the `busbw` column,
         not the `NCCL_NVLS_ENABLE=0` one): an 8x H200 node and an 8x B200 p6-b200.48xlarge node

The tables print bus bandwidth (`busbw`, GB/s = 1e9 B/s, sizes in KiB/MiB/GiB = 2^10..); a
call's time is bytes x 2 (n-1) / n / busbw (nccl-tests' and the benchmark's own correction).
all_reduce_bench's busbw is the mean over ranks and iterations of each call's bytes / time, so
the time derived is a harmonic mean. Rows printed below 1.00 GB/s (two significant figures or
fewer: the 4-node 32-128 KiB calls) are left out: their rounding alone moves the time by more
than 1%.

    python scripts/extract_mle_all_reduce.py [--source PATH] [--out DIR]

PATH is a checkout or bare git mirror of the repository (read at HEAD; default
/work/.mirror/stas00+ml-engineering/repo).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from extract_nccl_tests import head_commit, show
from extract_operators import OUT, write

REPO = "github.com/stas00/ml-engineering"
PATH = "network/README.md"
LICENCE = "CC BY-SA 4.0 (LICENSE-CC-BY-SA; Stas Bekman and contributors)"
MIN_GBPS = 1.0
UNITS = {"KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}
SIZE = re.compile(r"^(\d+)(KiB|MiB|GiB)$")
GBPS = re.compile(r"^([\d.]+)GBps$")


@dataclass(frozen=True)
class Table:
    """One table of network/README.md: the sentence before it, the column kept and the run."""

    anchor: str
    column: int  # the busbw column
    device: str
    ranks: int  # 0: the table's first column is the rank count
    per_node: int
    size: int = 0  # bytes, where the table's first column is the rank count


TORCH = (
    Table("Here is the same sweep on an 8x H200 node, using this repo's", 1, "H200", 8, 8),
    Table("The following table aggregates the `busbw` measurements for `all_reduce`", 1,
          "B200", 8, 8),
    Table("The following table aggregates the `busbw` measurements for `all_reduce`", 2,
          "B200", 32, 8))
NCCL = (
    Table("Measured on an 8x H200 node at an 8GiB payload with `nccl-tests`", 2, "H200", 0, 8,
          8 * 2 ** 30),
    Table("The same sweep on an 8x B200 `p6-b200.48xlarge` node", 2, "B200", 0, 8,
          8 * 2 ** 30))
FILES = {"all_reduce_mle_torch.csv": TORCH, "all_reduce_mle_nccl_tests.csv": NCCL}


def table_rows(text: str, anchor: str) -> list[list[str]]:
    """The cells of the first markdown table after the line containing `anchor` (its header
    and rule rows dropped)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if anchor in ln), None)
    if start is None:
        raise ValueError(f"no line containing {anchor!r}")
    rows: list[list[str]] = []
    for ln in lines[start + 1:]:
        if ln.startswith("|"):
            rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]


def gbps(cell: str) -> float:
    m = GBPS.match(cell) or re.match(r"^([\d.]+)$", cell)
    if not m:
        raise ValueError(f"not a bandwidth: {cell!r}")
    return float(m.group(1))


def points(text: str, t: Table) -> list[tuple[int, int, float]]:
    """(ranks, bytes, ms) of one table's kept rows."""
    out = []
    for r in table_rows(text, t.anchor):
        if t.ranks:
            m = SIZE.match(r[0])
            if not m:
                raise ValueError(f"not a payload: {r[0]!r}")
            ranks, nbytes = t.ranks, int(m.group(1)) * UNITS[m.group(2)]
        else:
            ranks, nbytes = int(r[0]), t.size
        bus = gbps(r[t.column])
        if bus >= MIN_GBPS:
            out.append((ranks, nbytes, nbytes * 2 * (ranks - 1) / ranks / (bus * 1e9) * 1e3))
    if not out:
        raise ValueError(f"no rows after {t.anchor!r}")
    return out


HEADERS = {
    "all_reduce_mle_torch.csv": [
        "torch.distributed all_reduce (fp32 sum) timed by the book's all_reduce_bench.py: one "
        "process per GPU, one call after a barrier between cudaEvents, 20 iterations (launch "
        "eager); torch 2.9.1, CUDA 13.0, NCCL 2.27.7;",
        "8x H200 SXM on one NVSwitch node (8 ranks); AWS P6-B200: 8x B200 per node (NVLink 5), "
        "8x 50 GB/s EFA v4 per node, 1 node (8 ranks) and 4 nodes (32 ranks);"],
    "all_reduce_mle_nccl_tests.csv": [
        "nccl-tests all_reduce at 8 GiB over 4-8 ranks of one node, NCCL's default algorithm "
        "(the busbw column, not the NCCL_NVLS_ENABLE=0 one; launch eager, nccl-tests' "
        "default); NCCL 2.27.7;",
        "an 8x H200 node (NVLink 4 NVSwitch) and an 8x B200 p6-b200.48xlarge node (NVLink 5)"],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--source", type=Path,
                    default=Path("/work/.mirror/stas00+ml-engineering/repo"))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    try:
        commit, date = head_commit(args.source)
        text = show(args.source, PATH)
        data = {name: [[t.device, ranks, t.per_node, b, "eager", f"{ms:.6g}"]
                       for t in tables for ranks, b, ms in points(text, t)]
                for name, tables in FILES.items()}
    except (subprocess.CalledProcessError, FileNotFoundError, ValueError) as e:
        print(f"--source {args.source}: not a copy of {REPO} ({e})", file=sys.stderr)
        return 2
    for name, rows in data.items():
        write(args.out / name, [
            f"source: {REPO} commit {commit} ({date}); path {PATH}; licence {LICENCE}",
            *HEADERS[name],
            "ms = bytes x 2 (n-1)/n / busbw (the table's GB/s = 1e9 B/s); rows printed below "
            "1.00 GB/s left out (scripts/extract_mle_all_reduce.py)"],
            ["device", "ranks", "per_node", "bytes", "launch", "ms"], rows)
        print(f"wrote {len(rows)} all-reduce rows to {args.out / name} ({REPO} {commit[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
