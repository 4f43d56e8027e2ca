"""Host Adam: the rate at which torch's CPU AdamW steps fp32 parameters on a few threads.

Megatron-Core's HybridDeviceOptimizer (`--optimizer-cpu-offload`, which Miles' CPU-Adam recipes
turn on) steps each rank's optimizer shard on the host with `torch.optim.AdamW(fused=True)`
(megatron/core/optimizer/__init__.py, radixark/Megatron-LM @00f2f7d4fb13b4d5f113db37a7699624abc1affc:
"this flag is used to improve the performance of the cpu optimizer"), one optimizer per
parameter tensor (`build_cpu_optimizer_list`, megatron/core/optimizer/cpu_offloading/
hybrid_optimizer.py @235952df607b3820716e5e67728a5ab470ca33ae), on torch's intra-op threads,
which a Ray actor sets from its CPUs: OMP_NUM_THREADS = max(floor(num_cpus), 1)
(ray/_private/utils.py `set_omp_num_threads_if_unset`), so 1 for Miles' colocated trainer ranks
(num_cpus 0.4, miles/ray/train/actor_factory.py, placement_group.py @31f1ca96).

This benchmark steps the same way (one fused AdamW per tensor, weight decay on; the unfused
single-tensor path beside it for reference) and prints the parameters stepped per second per
thread count: the figure behind the Miles profile's `host_adam_gparams_s`
(placer/spec/framework.py). It prints, never asserts a time.
"""
from __future__ import annotations

import time

import torch

TENSORS = 4
NUMEL = 16_000_000  # 64 M fp32 parameters in all: params, grads and moments ~1 GB
REPEATS = 4


def rate(threads: int, fused: bool, seed: int = 0) -> float:
    """G parameters per second of the best of `REPEATS` AdamW steps on `threads` threads."""
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    params = [torch.nn.Parameter(torch.randn(NUMEL)) for _ in range(TENSORS)]
    for p in params:
        p.grad = torch.randn(NUMEL)
    opts = [torch.optim.AdamW([p], lr=1e-6, weight_decay=0.1, fused=fused) for p in params]
    for o in opts:  # the first step allocates the moments
        o.step()
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for o in opts:
            o.step()
        best = min(best, time.perf_counter() - t0)
    return TENSORS * NUMEL / best / 1e9


def main() -> None:
    print(f"torch {torch.__version__}, CPU AdamW, one optimizer per tensor, "
          f"{TENSORS} x {NUMEL:,} fp32 parameters, best of {REPEATS}: G parameters/s")
    print("threads   fused   single-tensor")
    for threads in sorted({1, torch.get_num_threads()}):
        print(f"{threads:>7}   {rate(threads, True):5.3f}   {rate(threads, False):13.3f}")


if __name__ == "__main__":
    main()
