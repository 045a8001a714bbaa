#!/usr/bin/env bash
# `deltaserve bench` on one H200 with CUDA vLLM 0.26.0 and a Llama-3-8B-shaped model with random bf16 weights (no
# checkpoint is reachable there; random weights run at the speed of real ones -- say so wherever these figures go).
# One call runs every trace in TRACES, one after the other on the same machine (same model, same MPS daemon; the
# second run reuses the first one's calibration profile), each writing $OUT/<NAME prefix>_<trace>.{json,csv,png,log}.
#
# Prerequisites:
#   here:  bash benchmarks/gpu/prepare_bench_h200.sh          (makes .whl/x: tokenizer, lengths.csv, Alpaca set, and
#          the Mooncake conversation trace)
#          and the vLLM wheels as in ../shared/tools/vllm-gpu/README.md (.whl/p1..p5: each part travels with the working
#          tree under the 64 MiB limit; p1..p4 in short calls)
#   there: last call with carry=[".whl/p5", ".whl/x"]:
#          source .whl/p5/device-install.sh && bash benchmarks/gpu/bench_h200.sh
#
# SGLang (HOST=sglang, CUDA SGLang 0.5.15; issue #18): carry the SGLang bundle instead of vLLM's (prepare_sglang_h200.sh:
#   call 1 carry [".whl-sgl/p1", ".whl/x/tokenizer"]: mkdir -p /tmp/sgl-wheels && cp .whl-sgl/p1/* /tmp/sgl-wheels/ &&
#          X=.whl/x BUDGET=0 bash benchmarks/gpu/bench_h200.sh          (copies part 1 and builds the model)
#   then the middle parts (30 MiB each since the tree grew: cp .whl-sgl/pN/* /tmp/sgl-wheels/), and
#   last call carry [".whl-sgl/pN", ".whl/x"]: source .whl-sgl/pN/device-install.sh && HOST=sglang \
#          SYSTEMS=bare,deltaserve,static_mps ... bash benchmarks/gpu/bench_h200.sh
#   SGLang has no stock/served systems in the bench (no `stock` runner registered); GPU_UTIL becomes SGLang's
#   mem_fraction_static (of the whole card, where vLLM's gpu_memory_utilization is too).
#
# DELTASERVE_COMMIT: pass the hash of the code you carried (`git rev-parse HEAD` here) -- the device's copy of the
#   tree has no .git, and every result JSON names its commit (environment.commit).
#
# Knobs (environment):
#   TRACES         space-separated: burst-light, burst-dense, production, or trace files (default: "burst-light
#                  $X/conversation_trace.jsonl" -- burst-light and a Mooncake window in one call). TRACE=... (one
#                  trace) is still honoured.
#   SYSTEMS        comma list (default bare,deltaserve,static_mps; add idle_only,llmstation,paper_rule,no_interrupt
#                  when the budget allows: each co-server costs ~2 x (15-20 s start-up + the window)). split_pool is refused on one GPU (the in-process engine cannot be capped;
#                  docs/benchmarks.md).
#                  stock,stock_ds_config: vLLM as shipped (its defaults: compile, its CUDA-graph mode, V2 runner,
#                  async scheduling, prefix caching) and vLLM given DeltaServe's engine settings, each in a child
#                  process beside the host (~1.5-2 min of start-up each with compilation); the inference tax
#                  (bench JSON "inference_tax") is measured against stock.
#                  served,served_paused: DeltaServe through vLLM's serving engine and its plugin (what `vllm serve`
#                  users run), co-serving the bench's job / with the job paused; child processes like stock (~1.5 min
#                  of start-up each), reading the calibration profile the bench stored first.
#   SATURATION     requests served all at once after bare's and the stock systems' replay (default 0: none).
#   STATIC_SHARES  MPS shares (%) of the static_mps trainer, one system per share (default 25,50,75).
#   SLO_REGIMES    paper,tight (default): every co-served system runs once per regime; the trainer baselines run once
#                  and are judged under both. tight is derived from the bare run of the same trace.
#   DURATION       seconds of a generated trace (default 10); FILE_DURATION seconds of a trace file's window (default
#                  12), TRACE_START where the window starts in file seconds (default 600), FILE_LOAD the window's mean
#                  rate as a fraction of the host's capacity (default 0.575: 55-60 %).
#   DEDICATED      seconds of the packed PEFT trainer alone, the harvest denominator (default 6).
#   HOST_OPTIONS   more host options, space-separated key=value (e.g. "compile=true async_scheduling=true"): every
#                  system on the host gets them, and stock_ds_config runs vLLM with the engine settings they make.
#   BUDGET         seconds for the bench part of the call (default 480; the model build before it takes ~1 min). Every
#                  trace but the last may use what is left less RESERVE (default 200) s per trace still to come.
#                  A run cut by its limit writes no results (the bench writes its files at the end).
# Budget estimate from the earlier H200 runs' phase times (these defaults have NOT been timed on the device yet):
# first trace ~5 min (vLLM start with kernel compilation ~1.5 min, calibration ~1 min, trainer alone ~15 s, then bare,
# 3 static shares and deltaserve under 2 regimes at ~15 s of start-up plus the window each), the second ~3.5 min
# (compile cache and calibration profile reused): about 9.5 min with the model build, at the edge of one call. If it
# overruns, drop a share (STATIC_SHARES=25,75) or a regime (SLO_REGIMES=tight). The full matrix (idle_only,
# llmstation, paper_rule, a 2-minute window, burst-dense, production) takes several calls (SYSTEMS / TRACES /
# FILE_DURATION).
#
# MPS: the daemon is started here, before any CUDA context, so vLLM, the backward process and the trainers are all MPS
# clients (DeltaServe's backward runs under MPS by design; static_mps caps only its trainer, the trainer alone runs
# uncapped). vLLM gets GPU_UTIL of the memory so the backward process (which shares the base weights through CUDA IPC)
# and a trainer (its own 16 GB copy) fit beside it.
set -uo pipefail
OUT=${OUT:-benchmarks/results/bench}
X=${X:-.whl/x}
TRACES=${TRACES:-${TRACE:-burst-light $X/conversation_trace.jsonl}}
SYSTEMS=${SYSTEMS:-bare,deltaserve,static_mps}
STATIC_SHARES=${STATIC_SHARES:-25,50,75}
SLO_REGIMES=${SLO_REGIMES:-paper,tight}
DURATION=${DURATION:-10}
FILE_DURATION=${FILE_DURATION:-12}
TRACE_START=${TRACE_START:-600}
FILE_LOAD=${FILE_LOAD:-0.575}
BUDGET=${BUDGET:-480}
RESERVE=${RESERVE:-200}
GPU_UTIL=${GPU_UTIL:-0.45}
MAX_BATCH_TOKENS=${MAX_BATCH_TOKENS:-4096}  # chunked-prefill token budget: 8192 makes a full step ~190 ms, past the paper TPOT for bare itself
BWD_TOKENS=${BWD_TOKENS:-256}     # tokens per optimizer step, every fine-tuning system alike
BUFFER=${BUFFER:-2048}            # activation buffer S_max
STOCK_TIMEOUT=${STOCK_TIMEOUT:-300}  # seconds a stock engine may take before it counts as failed (results kept)
SATURATION=${SATURATION:-0}       # requests at once after bare's/stock's replay (throughput at saturation)
DEDICATED=${DEDICATED:-6}        # seconds of the packed PEFT trainer alone (the harvest denominator)
HOST=${HOST:-vllm}
case "$HOST" in
  sglang) MEM_OPTION=mem_fraction_static ;;
  vllm) MEM_OPTION=gpu_memory_utilization ;;
  *) echo "HOST=$HOST: this script runs vllm or sglang"; exit 2 ;;
esac
PREFIX=${NAME:-bench_${HOST}_llama8b-shape}
HOST_OPT_ARGS=()
for kv in ${HOST_OPTIONS:-}; do HOST_OPT_ARGS+=(--option "$kv"); done
MODEL=${MODEL:-/tmp/llama8b-shape}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 DELTASERVE_CACHE=${DELTASERVE_CACHE:-/tmp/dsc} VLLM_NO_USAGE_STATS=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1

# (1) the model folder: Llama-3-8B shape, random weights (seeded), bf16, the carried tokenizer
if [ ! -f "$MODEL/model.safetensors.index.json" ] && [ ! -f "$MODEL/model.safetensors" ]; then
  timeout 300 python3 - "$MODEL" "$X/tokenizer" <<'PY' || exit 1
import shutil, sys, time, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
out, tok = Path(sys.argv[1]), Path(sys.argv[2])
t = time.time()
cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
torch.manual_seed(0)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True, max_shard_size="5GB")
for f in tok.iterdir():
    shutil.copy(f, out / f.name)
print(f"built {out} in {time.time() - t:.0f} s")
PY
fi

# (2) MPS for static_mps (and the backward process)
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d 2>/dev/null || echo "MPS daemon already running or unavailable"

# (3) the benchmarks: per trace every system, same arrivals, one run. --ttft/--tpot are not passed: the paper regime
# is 400 ms / 120 ms, the tight one derived from bare. Lengths: a trace file's own, clipped to 1024 / 256 tokens
# (the JSON's trace.params counts the clipped requests); generated traces draw ShareGPT lengths.
T_END=$(( $(date +%s) + BUDGET ))
set -- $TRACES
NLEFT=$#
for TR in $TRACES; do
  LEFT=$(( T_END - $(date +%s) ))
  CAP=$(( LEFT - RESERVE * (NLEFT - 1) ))
  NLEFT=$(( NLEFT - 1 ))
  if [ "$CAP" -lt 60 ]; then echo "[bench_h200] budget spent, skipping $TR"; continue; fi
  if [ -f "$TR" ]; then
    TAG=$(basename "${TR%.*}")_w${TRACE_START}
    EXTRA=(--trace-start "$TRACE_START" --duration "$FILE_DURATION" --load "$FILE_LOAD")
  else
    TAG=$TR
    EXTRA=(--duration "$DURATION")
  fi
  echo "[bench_h200] $TR: up to ${CAP} of ${LEFT} s left"
  timeout "$CAP" deltaserve bench --host "$HOST" --model "$MODEL" --device cuda --dtype bfloat16 \
    --trace "$TR" "${EXTRA[@]}" --lengths "$X/lengths.csv" --dataset "$X/alpaca_en_demo.json" \
    --max-prompt 1024 --max-output 256 --max-running 64 --max-batch-tokens "$MAX_BATCH_TOKENS" --slo-regime "$SLO_REGIMES" \
    --option "$MEM_OPTION=$GPU_UTIL" ${HOST_OPT_ARGS[@]+"${HOST_OPT_ARGS[@]}"} --static-shares "$STATIC_SHARES" --dedicated "$DEDICATED" \
    --backward-batch-tokens "$BWD_TOKENS" --buffer-tokens "$BUFFER" --systems "$SYSTEMS" --saturation "$SATURATION" \
    --stock-timeout "$STOCK_TIMEOUT" \
    --out "$OUT" --name "${PREFIX}_$TAG" --no-progress 2>&1 \
    | grep -v -E "Warning|warn\(|^\s*$" | tee "$OUT/${PREFIX}_$TAG.log" | tail -40
done
echo quit | nvidia-cuda-mps-control 2>/dev/null || true
