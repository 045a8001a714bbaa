"""`deltaserve conformance sglang` through the CLI, as an operator runs it: the suite against SGLang's CPU engine
in a fresh process (the shims reach it through PYTHONPATH, set by tests/sglang/conftest.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None


@pytest.mark.skipif(not HAVE_SGLANG, reason="SGLang is not installed (bash scripts/setup_sglang.sh)")
@pytest.mark.parametrize("options", [(), ("--option", "enable_mixed_chunk=false")], ids=["mixed", "not_mixed"])
def test_deltaserve_conformance_sglang_passes(cache_dir: Path, options: tuple[str, ...]) -> None:
    """Both of SGLang's step shapes: with its mixed chunk (the default; decodes ride along in prefill steps) and
    without it (a prefill step defers the decodes, which the proposed batch must list as waiting)."""
    cli = Path(sys.executable).with_name("deltaserve")
    env = dict(os.environ, DELTASERVE_CACHE=str(cache_dir), OMP_NUM_THREADS="1")
    proc = subprocess.run([str(cli), "conformance", "sglang", *options, "-v"], check=False, env=env,
                          capture_output=True, text=True, timeout=900)
    summary = [line for line in proc.stdout.splitlines() if "passed" in line or "failed" in line or "FAILED" in line]
    assert proc.returncode == 0, "deltaserve conformance sglang failed:\n" + "\n".join(summary[-20:]) + proc.stderr[-2000:]
