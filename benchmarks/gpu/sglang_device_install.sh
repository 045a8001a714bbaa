#!/usr/bin/env bash
# On the GPU machine (copied into the last bundle part as device-install.sh by prepare_sglang_h200.sh): reassemble
# the carried SGLang bundle, verify it, install it --no-deps into /tmp/sglang-site, put that first on PYTHONPATH.
# Usage, from the repository root there: source .whl-sgl/pN/device-install.sh
# Parts carried by earlier calls of the same warm machine were copied to /tmp/sgl-wheels by those calls
# (`mkdir -p /tmp/sgl-wheels && cp .whl-sgl/p*/* /tmp/sgl-wheels/`); the parts this call carries are added here.
# Idempotent: a second call on the same machine finds the installed site and only sets the environment.
SITE=/tmp/sglang-site
mkdir -p /tmp/sgl-wheels
if [ ! -f "$SITE/.installed" ]; then
  cp .whl-sgl/p*/* /tmp/sgl-wheels/ 2>/dev/null
  ( cd /tmp/sgl-wheels && cat bundle.tar.[0-9][0-9] | tar -x && sha256sum -c --quiet SHA256SUMS ) \
    || { echo "SGLang bundle incomplete: did every part arrive on this machine? (ls /tmp/sgl-wheels)"; return 1 2>/dev/null || exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" /tmp/sgl-wheels/*.whl \
    || { echo "pip install of the SGLang bundle failed"; return 1 2>/dev/null || exit 1; }
  touch "$SITE/.installed"
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1
echo "SGLang bundle installed in $SITE: $(python3 -c 'import importlib.metadata as m; print("sglang", m.version("sglang"), "transformers", m.version("transformers"))' 2>&1 | tail -1)"
