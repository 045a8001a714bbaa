"""The end-to-end co-serving tests of test_coserve.py (exactness, unchanged greedy outputs, no fine-tuning row reaching
a client, loss decreasing, backward crash recovery) through SGLang's real CPU engine.

Same tests, same job; only the host differs (one SGLang engine for the module).
"""

from __future__ import annotations

import importlib.util
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

    h = create_host("sglang", HostConfig(model=str(tiny_model)))
    yield h
    h.shutdown()
