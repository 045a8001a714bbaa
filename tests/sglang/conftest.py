"""SGLang test environment: the test-only shims, and a hard failure when CI expects SGLang and it is missing.

Runs before any test module here imports SGLang. The shims (``shims/``: ``sgl_kernel``, ``torchvision``, the
pin_memory patch; each file says why it exists) are put first on ``sys.path`` for this process and on
``PYTHONPATH`` for the processes SGLang or the tests start (``shims/sitecustomize.py`` applies the pin_memory
patch there). The product (``deltaserve_sglang``) never imports any of them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

SHIMS = Path(__file__).resolve().parent / "shims"

os.environ.setdefault("OMP_NUM_THREADS", "1")
#: DELTASERVE_SGLANG_DEVICE=cuda (benchmarks/gpu/sglang_h200.sh) runs these tests against CUDA SGLang: then neither
#: the CPU engine nor the shims (a CPU sgl_kernel stand-in would shadow the real CUDA one) may be used.
ON_CPU = os.environ.get("DELTASERVE_SGLANG_DEVICE", "cpu") == "cpu"
if ON_CPU:
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
if not HAVE_SGLANG and os.environ.get("DELTASERVE_REQUIRE_ENGINES"):
    # CI sets this: there a missing engine is a broken setup, not a reason to skip.
    raise RuntimeError("DELTASERVE_REQUIRE_ENGINES is set but SGLang is not installed: run scripts/test_sglang.sh "
                       "(it builds .venv-sglang) or bash scripts/setup_sglang.sh")

if HAVE_SGLANG and ON_CPU:
    sys.path.insert(0, str(SHIMS))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SHIMS)] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    import deltaserve_pin_memory_shim

    deltaserve_pin_memory_shim.apply()
