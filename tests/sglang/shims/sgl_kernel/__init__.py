"""TEST-ONLY stand-in for SGLang's ``sgl_kernel`` package, so SGLang's real CPU engine runs in CI.

Why it exists: ``sglang==0.5.23`` imports ``sgl_kernel.assign_req_to_token_pool_cpu`` at import time on CPU
(``sglang/srt/mem_cache/allocation.py``), but the only published ``sgl_kernel`` builds are the CUDA wheel
``sglang-kernel`` (373 MB, needs CUDA) and SGLang's own CPU build (compiled from source with Intel's toolchain).
Other CPU kernels are imported at import time too (``copy_all_layer_kv_cache_cpu``, the speculative-decoding ones)
but never reached on the engine path the tests use (``attention_backend="torch_native"``,
``sampling_backend="pytorch"``, fp32, no speculative decoding, no KV moves). This module implements the one
function that path calls in plain torch; any other name imports as a function that raises when called, so a
test that strays off that path fails loudly instead of computing something wrong.

It lives under ``tests/``: the product (``deltaserve_sglang``) never imports it. It is put on ``sys.path`` by
``tests/sglang/conftest.py`` (and on ``PYTHONPATH`` for SGLang's subprocesses) only when no real ``sgl_kernel``
is installed.
"""

from __future__ import annotations

import torch

__all__ = ["assign_req_to_token_pool_cpu"]
__deltaserve_test_shim__ = True


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """Write each request's newly allocated KV slots into its row of the request-to-token table.

    Request ``i`` owns ``out_cache_loc[sum(lengths[:i]) : sum(lengths[:i+1])]`` and those slots go to
    ``req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]`` (``pool_len`` is the row width, which
    the CUDA kernel needs for pointer arithmetic and plain indexing does not).
    """
    del pool_len
    offset = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[offset:offset + n].to(req_to_token.dtype)
        offset += n


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not implemented by DeltaServe's test shim "
                                  "(tests/sglang/shims/sgl_kernel): the tests' SGLang engine path should not reach it")

    unavailable.__name__ = name
    return unavailable
