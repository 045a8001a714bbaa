"""The end-to-end co-serving tests of test_coserve.py (exactness, unchanged greedy outputs, no fine-tuning row reaching
a client, loss decreasing, backward crash recovery) through SGLang's real CPU engine.

Same tests, same job; only the host differs (one SGLang engine for the module). On a GPU machine
``DELTASERVE_SGLANG_DEVICE=cuda`` (bf16 by default, ``DELTASERVE_SGLANG_DTYPE``) runs the same module against CUDA
SGLang 0.5.15 (benchmarks/gpu/sglang_h200.sh); there the fp32 exactness test gives way to
``test_cuda_training_through_sglang_equals_plain_peft`` (precision's own criterion, as on vLLM).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from test_coserve import (  # noqa: F401  (collected here again, against the SGLang host)
    dataset,
    test_backward_crash_is_recovered_without_touching_inference,
    test_coserving_keeps_client_outputs_and_learns,
    test_rows_the_host_refuses_are_admissible_again,
    test_training_through_the_host_equals_plain_peft,
)

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
DEVICE = os.environ.get("DELTASERVE_SGLANG_DEVICE", "cpu")
DTYPE = os.environ.get("DELTASERVE_SGLANG_DTYPE", "float32" if DEVICE == "cpu" else "bfloat16")
OPTIONS = dict(kv.split("=", 1) for kv in os.environ.get("DELTASERVE_SGLANG_OPTIONS", "").split(",") if "=" in kv)
on_cuda = pytest.mark.skipif(not DEVICE.startswith("cuda"), reason="DELTASERVE_SGLANG_DEVICE=cuda (a GPU machine)")
if DTYPE != "float32":
    # the fp32 criterion (1e-4) does not apply to a bf16 engine: test_cuda_training_through_sglang_equals_plain_peft
    del test_training_through_the_host_equals_plain_peft


@pytest.fixture(scope="module")
def exactness_tolerance() -> float:
    """SGLang's fp32 CPU kernels (torch-native attention, torch LoRA backend) reduce in another order than
    transformers, so captured layer inputs differ from HF's at fp32 rounding and AdamW magnifies that on gradient
    entries near zero, as with vLLM (same tolerance). The training path itself is bit-exact given its captures
    (tests/test_exactness.py)."""
    return 1e-4


@pytest.fixture(scope="module")
def host(tiny_model: Path):
    if not HAVE_SGLANG:
        pytest.skip("SGLang is not installed (bash scripts/setup_sglang.sh)")
    from deltaserve_core.driver import HostConfig
    from deltaserve_core.registry import create_host

    h = create_host("sglang", HostConfig(model=str(tiny_model), device=DEVICE, dtype=DTYPE, options=OPTIONS))
    yield h
    h.shutdown()


@on_cuda
def test_cuda_training_through_sglang_equals_plain_peft(host, dataset, tiny_model: Path,  # noqa: ANN001, F811
                                                        tmp_path: Path) -> None:
    """test_coserve.py's exactness test (same job, requests and steps) through CUDA SGLang; the adapter trained on
    the GPU is compared on the CPU with the fp32 PEFT loop. The engine is bf16, so the criterion is precision's own:
    the update is as close to fp32 PEFT as plain PEFT's in the same dtype (test_coserve.assert_within_precision).
    Prints both."""
    from test_coserve import assert_within_precision, train_and_compare

    details: dict = {}
    worst, moved, steps = train_and_compare(host, dataset, tiny_model, tmp_path, details)
    print(f"exactness {DTYPE} sglang engine: {steps} optimizer steps, adapter moved {moved:.3g}, max relative "
          f"difference from the fp32 PEFT loop {worst:.3g}; update error {details['update_error']:.3g} (relative L2), "
          f"plain PEFT in {DTYPE}: {details.get('peft_update_error', float('nan')):.3g}")
    assert moved > 0, "training did not change the adapter"
    if DTYPE == "float32":
        assert worst <= 1e-4, f"relative difference {worst:.3g}"
    else:
        assert_within_precision(details)
