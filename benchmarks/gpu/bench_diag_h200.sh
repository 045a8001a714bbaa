#!/usr/bin/env bash
# A two-system `deltaserve bench` on one H200 (bare and deltaserve only, same arrivals, 20 s of burst-light, the
# Llama-3-8B shape with random bf16 weights, vLLM 0.26.0): the short run used to find why DeltaServe missed TPOT in
# the full 7-system run (benchmarks/results/bench/bench_vllm_llama8b-shape_burst-light.*). Its per-step CSV
# (<name>_steps.csv: duration, admission's prediction, shape, fine-tuning rows per step) is what showed a 62 ms gap
# between two decode steps: the adapter install after an optimizer step. Results before and after deferring that
# install: benchmarks/results/bench/h200_deferred_install/{before,after}/.
#
# Prerequisites as for bench_h200.sh: the bundle parts but the last carried in short calls, then, in the last call with
# carry=[".whl/p5", ".whl/x"]:  bash benchmarks/gpu/bench_diag_h200.sh      (~5.5 min on a fresh machine)
set -uo pipefail
source "$(ls .whl/p*/device-install.sh | head -1)" >/dev/null || exit 1
OUT=${OUT:-benchmarks/results/bench}
NAME=${NAME:-diag}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 DELTASERVE_CACHE=${DELTASERVE_CACHE:-/tmp/dsc} VLLM_NO_USAGE_STATS=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
# the model folder, built exactly as bench_h200.sh step (1) builds it
MODEL=/tmp/llama8b-shape X=.whl/x
source <(sed -n '/^# (1)/,/^fi$/p' benchmarks/gpu/bench_h200.sh)
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" "$OUT/$NAME"
nvidia-cuda-mps-control -d 2>/dev/null || echo "MPS daemon already running or unavailable"
timeout ${T_BENCH:-400} deltaserve bench --host vllm --model "$MODEL" --device cuda --dtype bfloat16 --systems bare,deltaserve \
  --trace burst-light --duration 20 --lengths "$X/lengths.csv" --dataset "$X/alpaca_en_demo.json" \
  --max-prompt 1024 --max-output 256 --max-running 64 --max-batch-tokens 8192 --ttft 0.4 --tpot 0.12 \
  --option gpu_memory_utilization=0.45 --dedicated 5 --out "$OUT/$NAME" --name "$NAME" --no-progress --no-plot 2>&1 \
  | grep -E "^\[bench\]|^system|^bare|^deltaserve|goal|Error" | tail -30
echo quit | nvidia-cuda-mps-control 2>/dev/null || true
