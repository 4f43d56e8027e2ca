"""Extract the operator-level profiles that `python -m workflows.operators` prices from Vidur
(github.com/microsoft/vidur): per-layer kernel times and NCCL collectives measured on A100 and
H100 nodes. Writes a compact, committed subset to workflows/data/operators/:

  layers.csv      per (device, model, TP, tokens): the median ms of each kernel Vidur's
                  data/profiling/compute/<dev>/<model>/mlp.csv times for one decoder layer
  all_reduce.csv  per (device, ranks, bytes): the median ms of one NCCL all-reduce inside a node
                  (data/profiling/network/<dev>_dgx/all_reduce.csv)
  send_recv.csv   per (device, devices per node, bytes): one send/recv between two ranks
                  (data/profiling/network/<dev>_dgx/send_recv.csv)
  all_reduce_sweep.csv  the same in-node all-reduces at every size Vidur swept up to
                  SWEEP_DENSE_BYTES and every SWEEP_STRIDE-th above: the dense sweep that
                  workflows/opmodes.py reads to ask whether a kernel's mode (the collective, or
                  a peer's host launch) follows from anything the planner knows
  attention.csv   per (prefill chunk or decode batch, KV context): the median ms of one layer's
                  FlashAttention kernel on an A100 (data/profiling/a100/attention.csv as first
                  published, at ATTENTION_COMMIT: the later per-model attention.csv files are
                  absent from the mirror; this one is present there and in the public history)

Each file starts with '#' lines naming the source repository, its commit, the paths and units.
Points are picked to cover the range, not every row: tokens 1, 2, 4, ... 4096; every TP degree;
message sizes nearest each power of two. Where a (tokens, TP) pair has several rows the median
of their medians is kept.

Vidur's `size` column is bytes (vidur/profiling/collectives/collectives_wrapper.py writes
`self._size * 2  # bytes` for an fp16 buffer of `_size` elements, and
sklearn_execution_time_predictor.py reads tokens as size / embedding_dim / 2); its collective
times are the NCCL kernels' durations (a kineto timer filtered on "nccl", median), not host time.

Left out: A40 (not a catalog device), the pairwise-NVLink boxes (their links are not the
catalog's SXM NVLink), non-gated MLPs (phi-2: the cost model's dense MLP is SwiGLU) and
all-reduces that span nodes (a TP group stays in one node).

    python scripts/extract_operators.py [--source PATH] [--out DIR]

PATH is a Vidur checkout or a bare git mirror of it (default /work/.mirror/microsoft+vidur/repo).
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

DEVICES = {"a100": "A100-80G", "h100": "H100-SXM"}
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
             "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
TOKENS = tuple(2 ** k for k in range(13))  # 1 .. 4096
SIZE_TARGETS = tuple(2 ** k for k in range(12, 28))  # 4 KiB .. 128 MiB
SWEEP_DENSE_BYTES = 8 * 2 ** 20  # every swept size up to here (the host-bound kernels lie below)
SWEEP_STRIDE = 8  # above it, every 8th swept size
ATTENTION_COMMIT = "e2d00e9afba96cec9f0e7ea560bbfc4a539fae6a"  # "Copy files fromm internal fork"
ATTENTION_PATH = "data/profiling/a100/attention.csv"
CHUNKS = (128, 256, 512, 1024, 2048, 4096)  # prefill chunk tokens
CHUNK_CONTEXTS = (0, 512, 1024, 2048, 3072)  # KV tokens before the chunk
DECODE_BATCHES = tuple(2 ** k for k in range(8))  # 1 .. 128 sequences
DECODE_CONTEXTS = (128, 512, 1024, 2048, 4032)  # KV tokens per sequence (4032: Vidur's largest)
SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size")
OUT = Path(__file__).resolve().parent.parent / "workflows" / "data" / "operators"


class Source:
    """A Vidur checkout (a folder) or a bare git mirror (read at HEAD)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bare = not (path / "data").is_dir()
        git = ["git", "-C", str(path), "rev-parse", "HEAD"]
        self.commit = subprocess.run(git, capture_output=True, text=True, check=True).stdout.strip()

    def files(self, prefix: str) -> list[str]:
        if not self.bare:
            return sorted(str(p.relative_to(self.path)) for p in (self.path / prefix).rglob("*")
                          if p.is_file())
        cmd = ["git", "-C", str(self.path), "ls-tree", "-r", "--name-only", "HEAD", prefix]
        return sorted(subprocess.run(cmd, capture_output=True, text=True, check=True)
                      .stdout.split())

    def rows(self, rel: str, commit: str = "HEAD") -> list[dict[str, str]]:
        if self.bare or commit != "HEAD":
            text = subprocess.run(["git", "-C", str(self.path), "show", f"{commit}:{rel}"],
                                  capture_output=True, text=True, check=True).stdout
        else:
            text = (self.path / rel).read_text()
        return list(csv.DictReader(io.StringIO(text)))


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def layer_rows(src: Source) -> tuple[list[list[object]], list[str]]:
    out: list[list[object]] = []
    paths: list[str] = []
    for rel in src.files("data/profiling/compute"):
        parts = rel.split("/")
        if parts[-1] != "mlp.csv" or parts[3] not in DEVICES:
            continue
        rows = src.rows(rel)
        if not rows or rows[0]["use_gated_mlp"] != "True":
            continue
        paths.append(rel)
        model = "/".join(parts[4:-1])
        groups: dict[tuple[int, int], list[dict[str, str]]] = {}
        for r in rows:
            key = (int(r["num_tensor_parallel_workers"]), int(r["num_tokens"]))
            groups.setdefault(key, []).append(r)
        for (tp, tokens), rs in sorted(groups.items()):
            if tokens not in TOKENS:
                continue
            ops = [round(_median([float(r[f"time_stats.{op}.median"]) for r in rs]), 5)
                   for op in LAYER_OPS]
            out.append([DEVICES[parts[3]], model, tp, tokens, *(rs[0][s] for s in SHAPE), *ops])
    return out, paths


def nearest_sizes(sizes: set[int]) -> list[int]:
    return sorted({min(sizes, key=lambda s: abs(s - t)) for t in SIZE_TARGETS})


def collective_rows(src: Source, name: str) -> tuple[list[list[object]], list[str]]:
    out: list[list[object]] = []
    paths: list[str] = []
    for dev, device in DEVICES.items():
        rel = f"data/profiling/network/{dev}_dgx/{name}.csv"
        rows = src.rows(rel)
        paths.append(rel)
        groups: dict[tuple[int, int], dict[int, list[float]]] = {}
        for r in rows:
            n, per_node = int(r["num_workers"]), int(r["devices_per_node"])
            if name == "all_reduce" and per_node != n:
                continue  # spans nodes: not a TP group
            groups.setdefault((n, per_node), {}).setdefault(int(r["size"]), []).append(
                float(r[f"time_stats.{name}.median"]))
        for (n, per_node), by_size in sorted(groups.items()):
            for size in nearest_sizes(set(by_size)):
                out.append([device, n, per_node, size, round(_median(by_size[size]), 5)])
    return out, paths


def sweep_rows(src: Source) -> tuple[list[list[object]], list[str]]:
    """Every in-node all-reduce size up to SWEEP_DENSE_BYTES, every SWEEP_STRIDE-th above
    (one row per size: the median of its rows where the sweep measured it twice, as
    `collective_rows` keeps it)."""
    out: list[list[object]] = []
    paths: list[str] = []
    for dev, device in DEVICES.items():
        rel = f"data/profiling/network/{dev}_dgx/all_reduce.csv"
        paths.append(rel)
        groups: dict[int, dict[int, list[float]]] = {}
        for r in src.rows(rel):
            n = int(r["num_workers"])
            if int(r["devices_per_node"]) == n:
                groups.setdefault(n, {}).setdefault(int(r["size"]), []).append(
                    float(r["time_stats.all_reduce.median"]))
        for n, by_size in sorted(groups.items()):
            sizes = sorted(by_size)
            big = [s for s in sizes if s > SWEEP_DENSE_BYTES]
            keep = [s for s in sizes if s <= SWEEP_DENSE_BYTES] + big[SWEEP_STRIDE - 1::SWEEP_STRIDE]
            out += [[device, n, n, s, round(_median(by_size[s]), 5)] for s in keep]
    return out, paths


def attention_rows(src: Source) -> list[list[object]]:
    """One layer's attention kernel (TP 2, Vidur's only shape in this file): a prefill chunk
    after a KV context (time_stats.attn_prefill) or a decode batch whose every sequence holds
    a KV context (time_stats.attn_decode); the reshapes around the kernel are left out."""
    groups: dict[tuple[str, int, int], list[float]] = {}
    shape: dict[str, str] = {}
    for r in src.rows(ATTENTION_PATH, ATTENTION_COMMIT):
        prefill = r["is_prefill"] == "True"
        size = int(r["prefill_chunk_size"] if prefill else r["batch_size"])
        kv = int(r["kv_cache_size"])
        wanted = ((size in CHUNKS and kv in CHUNK_CONTEXTS) if prefill
                  else (size in DECODE_BATCHES and kv in DECODE_CONTEXTS))
        if not wanted:
            continue
        kind = "prefill" if prefill else "decode"
        groups.setdefault((kind, size, kv), []).append(
            float(r[f"time_stats.attn_{kind}.median"]))
        shape = {k: r[k] for k in ("n_embd", "n_q_head", "n_kv_head",
                                   "num_tensor_parallel_workers", "attention_backend")}
    return [[DEVICES["a100"], shape["n_embd"], shape["n_q_head"], shape["n_kv_head"],
             shape["num_tensor_parallel_workers"], kind, size, kv, round(_median(ts), 5)]
            for (kind, size, kv), ts in sorted(groups.items())]


def write(path: Path, header: list[str], columns: list[str], rows: list[list[object]]) -> None:
    buf = io.StringIO()
    buf.writelines(f"# {line}\n" for line in header)
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    w.writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(buf.getvalue())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=Path("/work/.mirror/microsoft+vidur/repo"))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    try:
        src = Source(args.source)
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        print(f"--source {args.source}: not a Vidur checkout or git mirror ({e})", file=sys.stderr)
        return 2
    origin = [f"source: github.com/microsoft/vidur commit {src.commit}"]
    layers, paths = layer_rows(src)
    write(args.out / "layers.csv", origin + [
        "paths: " + " ".join(paths),
        "one decoder layer's kernels, median ms over Vidur's runs (time_stats.<op>.median);",
        "tokens: num_tokens of the pass; tp: num_tensor_parallel_workers; shape columns as Vidur's",
        "device: the catalog's name for Vidur's a100 / h100 profiles"],
        ["device", "model", "tp", "tokens", *SHAPE, *(f"{op}_ms" for op in LAYER_OPS)], layers)
    for name in ("all_reduce", "send_recv"):
        rows, paths = collective_rows(src, name)
        write(args.out / f"{name}.csv", origin + [
            "paths: " + " ".join(paths),
            f"one NCCL {name}: median ms of its kernels (time_stats.{name}.median);",
            "bytes: Vidur's size column (bytes: collectives_wrapper.py writes size * 2 of an "
            "fp16 buffer); ranks: num_workers; per_node: devices_per_node"],
            ["device", "ranks", "per_node", "bytes", "ms"], rows)
    sweep, paths = sweep_rows(src)
    write(args.out / "all_reduce_sweep.csv", origin + [
        "paths: " + " ".join(paths),
        "one NCCL all_reduce inside a node at every swept size up to "
        f"{SWEEP_DENSE_BYTES} bytes and every {SWEEP_STRIDE}th above: median ms of its "
        "kernels (time_stats.all_reduce.median);",
        "bytes, ranks, per_node as in all_reduce.csv (one row per swept size)"],
        ["device", "ranks", "per_node", "bytes", "ms"], sweep)
    attn = attention_rows(src)
    write(args.out / "attention.csv", [
        f"source: github.com/microsoft/vidur commit {ATTENTION_COMMIT}",
        f"paths: {ATTENTION_PATH}",
        "one layer's attention kernel (attention_backend FLASH_ATTENTION, fp16, kineto timer), median ms "
        "(time_stats.attn_prefill / attn_decode.median);",
        "kind prefill: one sequence, size = chunk tokens after kv KV tokens (prefill_chunk_size, "
        "kv_cache_size); kind decode: size = batch sequences of kv KV tokens each;",
        "shape: n_embd, n_q_head, n_kv_head of the whole layer, split over tp ranks "
        "(num_tensor_parallel_workers); device: the catalog's name for Vidur's a100"],
        ["device", "n_embd", "n_head", "n_kv_head", "tp", "kind", "size", "kv", "ms"], attn)
    print(f"wrote {len(layers)} layer rows and the collectives to {args.out} "
          f"(vidur {src.commit[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
