"""The worked example of examples/new_host/README.md (a host over plain transformers + PEFT) passes the suite.

Run as a user runs an unregistered host: a fresh `deltaserve conformance hf_host.host:create_host` process with the
example on PYTHONPATH, fast profile (the CLI's default). It keeps the recipe and the host kit honest: a kit change
that leaves the example behind fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "new_host"


def test_spec_imports_no_engine() -> None:
    # `deltaserve hosts` imports every spec: it must not pay for transformers (nor fail where it is missing).
    code = "import sys, hf_host.spec as s; assert 'transformers' not in sys.modules, 'spec imported the engine'; " \
           "print(s.SPEC.factory)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE), *sys.path])})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "hf_host.host:create_host"


@pytest.mark.slow
def test_example_host_passes_conformance() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE), *sys.path]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "deltaserve_core.cli", "conformance", "hf_host.host:create_host"],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
