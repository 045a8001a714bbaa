"""DeltaServe's vLLM executor: vLLM's one-process executor, plus capture points installed before the first forward.

vLLM compiles the model (torch.compile, its CUDA default) during its first forward, the memory-profiling run that
follows ``_init_executor``; hooks registered after that are never seen by the compiled code. So the capture points
(:mod:`.layer_tap`) go in here, between loading the model and that first forward. Both vLLM hosts run on it: the
in-process :class:`~deltaserve_vllm.host.VllmHost` directly, ``vllm serve`` through
:class:`~deltaserve_vllm.serving.DeltaServeExecutor`.
"""

from __future__ import annotations

from vllm.v1.executor.uniproc_executor import UniProcExecutor

__all__ = ["TapExecutor"]


class TapExecutor(UniProcExecutor):  # type: ignore[misc]
    """vLLM's one-process executor whose worker carries DeltaServe's capture points from the start."""

    def _init_executor(self) -> None:
        super()._init_executor()
        self.collective_rpc("deltaserve_install_taps")
