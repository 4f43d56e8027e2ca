#!/usr/bin/env bash
# GPU check for the executor's two engine backends (run on a machine with a CUDA GPU; minutes).
#
# vllm    in .venv (the gpu extra, installed when vllm is missing): tests/test_exec_vllm.py (the
#         engine in its Ray actor with the plan's TP, the job's max_model_len and the plan's
#         memory share; real log-probs; the engine shares the trainer's one GPU (colocated), so
#         every refresh is handed over as CUDA IPC into vLLM's workers, `collective_rpc` carrying
#         only handles and bucket heads) and tests/test_exec_vllm_config.py; prints VLLM_FIGURES
#         (tokens/s, mean weight-update time: CUDA IPC -> WeightSync.receive_handover ->
#         model.load_weights) and VLLM_GROUP (weight bytes against Ray's control bytes); the
#         group's NCCL path needs two GPUs. If the default attention backend rejects the
#         tiny model's head size (16), it retries once with vLLM's Triton attention backend.
# sglang  in .venv-sglang (the sglang extra, made when SGLang is missing): SGLang 0.5.23 pins
#         torch 2.14.1 and flashinfer 0.7.2, vLLM's torch-2.13 releases torch 2.13.0 and
#         flashinfer 0.7.0.post1, so the two engines cannot share one environment.
#         tests/test_exec_sglang.py (log-probs against the Hugging Face model, an in-place update
#         in buckets, a GRPO run on Ray whose refreshes, the engine sharing the trainer's one
#         GPU, are handed over in shared memory and loaded with update_weights_from_tensor) and
#         tests/test_exec_sglang_config.py; prints SGLANG_FIGURES (engine tokens/s, in-place
#         update time, the run's tokens/s and sync time) and SGLANG_GROUP (weight bytes against
#         Ray's control bytes). tests/test_exec_gpu_paths.py (sglang): the whole-tensor CUDA
#         IPC hand-over (handles named by device UUID) opened in another process by SGLang's
#         own TP-rank code; the run above takes it too (the engine shares the trainer's GPU).
# nccl    with two GPUs or more, in .venv: tests/test_exec_gpu_paths.py (nccl), a bucketed refresh
#         over a channel on vLLM's StatelessProcessGroup + PyNcclCommunicator (GPU 0 -> GPU 1).
#         One GPU cannot hold both ends of an NCCL group: then it is not run (said so).
# Exit 0 only when both pass. ONLY=vllm or ONLY=sglang runs one of them.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
SGVENV=${SGVENV:-.venv-sglang}
ONLY=${ONLY:-}
export RAY_USAGE_STATS_ENABLED=0
nvidia-smi -L || { echo "gpu_check: no GPU visible"; exit 1; }
status=0

tests() {  # python, log, files...: the tests' summary and figure lines
  local py=$1 log=$2; shift 2
  timeout 540 "$py" -m pytest -q -s -p no:cacheprovider "$@" 2>&1 | tee "$log" \
    | grep -E "VLLM_FIGURES|VLLM_GROUP|SGLANG_FIGURES|SGLANG_GROUP|passed|failed|skipped|Error"
}

all_passed() {  # log: pytest's summary says passed, and nothing failed, errored or was skipped
  tail -1 "$1" | grep -qE "[0-9]+ passed" && ! tail -1 "$1" | grep -qE "failed|error|skipped"
}

check_vllm() {
  if ! "$PY" -c "import vllm" 2>/dev/null; then
    echo "gpu_check: installing the gpu extra (vllm)"
    "$PY" -m pip install -q -e ".[gpu,test]" || { echo "gpu_check: pip install failed"; return 1; }
  fi
  "$PY" -c "import torch, vllm; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'vllm', vllm.__version__)"
  local files=(tests/test_exec_vllm.py tests/test_exec_vllm_config.py)
  if [ "$(nvidia-smi -L | grep -c '^GPU')" -ge 2 ]; then
    files+=(tests/test_exec_gpu_paths.py::test_a_refresh_over_vllms_stateless_nccl_channel)
  else
    echo "gpu_check: one GPU: the PyNccl channel test (two GPUs) is not run"
  fi
  tests "$PY" /tmp/gpu_check_vllm.log "${files[@]}"
  if ! all_passed /tmp/gpu_check_vllm.log; then
    echo "gpu_check: retrying with VLLM_ATTENTION_BACKEND=TRITON_ATTN"
    VLLM_ATTENTION_BACKEND=TRITON_ATTN tests "$PY" /tmp/gpu_check_vllm.log "${files[@]}"
  fi
  all_passed /tmp/gpu_check_vllm.log
}

check_sglang() {
  local sp="$SGVENV/bin/python"
  if ! "$sp" -c "import sglang.srt.entrypoints.engine" 2>/dev/null; then
    echo "gpu_check: installing the sglang extra in $SGVENV"
    [ -x "$sp" ] || python3 -m venv "$SGVENV" || { echo "gpu_check: venv failed"; return 1; }
    "$sp" -m pip install -q -e ".[sglang,test]" || { echo "gpu_check: pip install failed"; return 1; }
  fi
  "$sp" -c "import torch, sglang; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'sglang', sglang.__version__)"
  tests "$sp" /tmp/gpu_check_sglang.log tests/test_exec_sglang.py tests/test_exec_sglang_config.py \
    tests/test_exec_gpu_paths.py::test_sglang_opens_the_whole_tensor_cuda_ipc_hand_over
  all_passed /tmp/gpu_check_sglang.log
}

for engine in vllm sglang; do
  [ -n "$ONLY" ] && [ "$ONLY" != "$engine" ] && continue
  if "check_$engine"; then
    echo "gpu_check: $engine OK"
  else
    echo "gpu_check: $engine FAILED (log: /tmp/gpu_check_$engine.log)"
    tail -40 "/tmp/gpu_check_$engine.log" 2>/dev/null
    status=1
  fi
done
[ "$status" = 0 ] && echo "gpu_check: OK" || echo "gpu_check: FAILED"
exit "$status"
