#!/usr/bin/env bash
# GPU check for the executor's vllm backend (run on a machine with a CUDA GPU; a few minutes).
# Installs the gpu extra when vllm is missing, runs tests/test_exec_vllm.py (the engine in its Ray
# actor with the plan's TP, the job's max_model_len and the plan's memory share; real log-probs)
# and tests/test_exec_vllm_config.py (those settings, and missing log-probs refused), and prints
# the figures line (tokens/s of the engine, mean weight-update time through collective_rpc ->
# model.load_weights). If the default attention backend rejects the tiny model's head size (16),
# it retries once with vLLM's Triton attention backend.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export RAY_USAGE_STATS_ENABLED=0
nvidia-smi -L || { echo "gpu_check: no GPU visible"; exit 1; }
if ! "$PY" -c "import vllm" 2>/dev/null; then
  echo "gpu_check: installing the gpu extra (vllm)"
  "$PY" -m pip install -q -e ".[gpu,test]" || { echo "gpu_check: pip install failed"; exit 1; }
fi
"$PY" -c "import torch, vllm; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'vllm', vllm.__version__)"
run() { timeout 420 "$PY" -m pytest -q -s -p no:cacheprovider tests/test_exec_vllm.py tests/test_exec_vllm_config.py 2>&1 | tee /tmp/gpu_check.log | grep -E "VLLM_FIGURES|passed|failed|skipped|Error" ; }
run
if ! grep -q "5 passed" /tmp/gpu_check.log; then
  echo "gpu_check: retrying with VLLM_ATTENTION_BACKEND=TRITON_ATTN"
  VLLM_ATTENTION_BACKEND=TRITON_ATTN run
fi
grep -q "5 passed" /tmp/gpu_check.log && echo "gpu_check: OK" || { echo "gpu_check: FAILED (log: /tmp/gpu_check.log)"; tail -40 /tmp/gpu_check.log; exit 1; }
