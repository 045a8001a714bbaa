"""The exact LoRA backward: layer-by-layer recomputation from saved layer inputs, then AdamW.

What "exact" means here is fixed by :func:`~deltaserve_core.peft_steps.plain_peft_step`, the reference every test
compares against: one optimizer step per backward batch; each sample runs alone (no padding) through a
transformers + PEFT model; the loss is transformers' own causal-LM loss over the sample's target tokens, summed
over the batch and divided by the batch's total number of target tokens (``labels`` with ``-100`` on non-targets, ``num_items_in_batch`` = that
total); ``torch.optim.AdamW`` steps once after all samples' gradients accumulated.

:class:`LoraBackward` reaches the same gradients without the forward pass of that loop, because the host already
ran it while serving: the input of every decoder layer for every sample was captured (see
:mod:`deltaserve_core.activation_buffer`). It walks the layers top-down: the last layer is recomputed from its saved
input, followed by the model's final norm, its output head and the loss, and back-propagated to get the gradient
with respect to that layer's input plus the LoRA gradients of that layer; then layer ``L-2`` is recomputed from *its*
saved input and back-propagated with that gradient as ``grad_output``; and so on down to layer 0. Only one layer's
autograd graph exists at a time, and between units of work the process can be paused (the ``grant`` callable) so
inference prefill gets the device within one unit's worth of work.

A unit is one layer over a *packed* group of samples: the batch's samples concatenated into one sequence of up to
``TrainerConfig.pack_tokens`` tokens, positions restarting per sample, so the model's own mask construction keeps
each sample's attention inside the sample. Per-sample units (``pack_tokens=0``) are bit-identical to the reference
loop but launch- and sync-bound on a GPU (an 8B model's layer over one ~100-token sample is a fraction of a
millisecond of work); packed units do the same math on bigger shapes, so they agree with it to rounding
(tests/test_exactness.py) and train several times faster on a GPU (docs/benchmarks.md, "H200, packed backward").

Nothing here is specific to one model family: it runs the model's own decoder-layer modules with exactly the
keyword arguments the model's own forward would pass them (rotary embeddings, causal/sliding masks per layer type),
obtained by running the model's forward once per sequence length with the layers swapped for recording probes.
LoRA is applied with forward hooks on the targeted ``nn.Linear`` modules that add ``B(A(x)) * scaling`` exactly as
PEFT's ``lora.Linear`` does, so base weights are never copied or wrapped.

Runs in whichever process owns the model: normally the backward process (:mod:`deltaserve_core.backward_process`),
in-process in tests and benchmarks.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .activation_buffer import CapturedSample
from .adapter_state import LoraAdapterState, all_finite
from .model_parts import attention_without_cudnn, decoder_parts, pack_groups, transformers_packs

__all__ = [
    "BackwardCancelled",
    "LoraBackward",
    "StepResult",
    "TrainerConfig",
]

_PEFT_PREFIX = "base_model.model."


class BackwardCancelled(RuntimeError):
    """Raised by a ``grant`` callable to abandon the batch in progress (its gradients are dropped)."""


@dataclass(frozen=True, slots=True)
class TrainerConfig:
    """Optimiser and batching settings of the fine-tuning job (defaults: the paper's)."""

    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    #: backward batch size in tokens: captured samples accumulate until they reach it (paper: 256)
    backward_batch_tokens: int = 256
    #: clip the global gradient norm before the step (``None``: no clipping, like the reference loop)
    max_grad_norm: float | None = None
    #: run the output head only on rows that predict a target token (prompt rows skip it). Same loss, but the
    #: smaller matmul rounds differently (~1e-6 relative in gradients) and AdamW amplifies that on near-zero
    #: gradient entries; default off so training is bit-identical to the plain PEFT loop. Saves the head's share of
    #: the work on prompt tokens (large for small models with big vocabularies).
    head_on_targets_only: bool = False
    #: samples of a batch are packed into units of up to this many tokens (one sequence, block-diagonal causal
    #: mask, positions restarting per sample), and each layer runs once per unit instead of once per sample. On a
    #: GPU the per-sample loop is launch- and sync-bound (a unit per (layer, sample)); packing makes the unit count
    #: ``layers x ceil(batch / pack_tokens)``. Same gradients up to rounding (the matmuls and attention see other
    #: shapes; fp32 agrees with the reference to ~1e-6 relative). ``0``: one sample per unit, bit-identical to the
    #: reference loop. A unit is also the preemption granularity, so this bounds how long inference can wait.
    pack_tokens: int = 2048

    def __post_init__(self) -> None:
        if not math.isfinite(self.lr) or self.lr <= 0 or self.backward_batch_tokens <= 0:
            raise ValueError(f"TrainerConfig needs a finite lr > 0 (got {self.lr!r}) and backward_batch_tokens > 0")
        if self.pack_tokens < 0:
            raise ValueError(f"TrainerConfig.pack_tokens must be >= 0 (0: no packing), got {self.pack_tokens}")


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one optimizer step did; reported to the controller by the backward process."""

    step: int
    loss: float
    sample_ids: tuple[int, ...]
    tokens: int
    target_tokens: int
    duration_s: float
    layer_times_s: tuple[float, ...] = field(default=(), repr=False)
    #: non-empty when the step was skipped because this was not finite ("loss", "gradients" or "weights"): the
    #: adapter, the optimizer state and :attr:`LoraBackward.step` are then as they were before the batch
    nonfinite: str = ""


def samples_meta(samples: Sequence[CapturedSample]) -> list[tuple[int, int, int]]:
    """(sample id, tokens, target tokens) of each sample: what an open optimizer step remembers of its parts."""
    return [(s.sample_id, s.num_tokens, s.num_targets) for s in samples]


class _Probe(nn.Module):
    """Stands in for a decoder layer during one forward to record the keyword arguments the model passes it."""

    def __init__(self, real: nn.Module, index: int, store: list[Any]) -> None:
        super().__init__()
        object.__setattr__(self, "_real", real)  # not a submodule: nothing of the layer runs
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_store", store)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self._store[self._index] = (args, kwargs)
        return hidden_states

    def __getattr__(self, name: str) -> Any:  # model forwards may read e.g. `layer.attention_type`
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_real"), name)


class LoraBackward:
    """Trains a LoRA adapter on captured layer inputs; owns the trainable parameters and the optimizer.

    Args:
        model: the base causal LM. Its parameters get ``requires_grad=False``; otherwise it is left as it is, except
            while a method of this class runs: LoRA forward hooks are attached to the targeted linears and, once per
            new sequence length, the decoder's ``layers`` list is swapped for probes. So the same model *object* must
            not run in another thread meanwhile (the backward process owns its own object over the shared weights).
        adapter: initial adapter weights with PEFT keys. Its tensors become the trainable parameters *in place*
            (``nn.Parameter`` shares their storage), so when they live in shared memory every process that maps them
            sees each optimizer step.
        config: optimizer/batching settings.

    Created by the backward process at start-up (or by tests/benchmarks in-process). Not thread-safe: one
    backward at a time.
    """

    def __init__(self, model: nn.Module, adapter: LoraAdapterState, config: TrainerConfig = TrainerConfig()) -> None:
        self.model = model
        self.config = config
        self.lora = adapter.config
        if adapter.config.lora_dropout:
            # The host's forward (which produced every later layer's saved input) runs without dropout, so a
            # dropout mask in the recompute could not be consistent with it: train without dropout, say so.
            import warnings

            warnings.warn(
                f"lora_dropout={adapter.config.lora_dropout} is ignored: DeltaServe's forward runs inside the "
                "inference engine, which applies no dropout, so the backward trains without it",
                stacklevel=2,
            )
        self.adapter_name = adapter.name
        self.base_model_path = adapter.base_model_path
        self.decoder, self.layers, self.norm, self.head, self.layers_path = decoder_parts(model)
        for p in model.parameters():
            p.requires_grad_(False)
        self.num_layers = len(self.layers)
        self.params: OrderedDict[str, nn.Parameter] = OrderedDict()
        for key in sorted(adapter.tensors):
            t = adapter.tensors[key]
            self.params[key] = nn.Parameter(t.detach(), requires_grad=True)
        # (module, A, B) per adapted linear; the layer index decides which recompute it belongs to
        self._targets: list[tuple[nn.Module, nn.Parameter, nn.Parameter]] = []
        for key in self.params:
            if not key.endswith(".lora_A.weight"):
                continue
            bkey = key[: -len("A.weight")] + "B.weight"
            if bkey not in self.params:
                raise ValueError(f"adapter has {key} but no {bkey}")
            path = key[len(_PEFT_PREFIX): -len(".lora_A.weight")] if key.startswith(_PEFT_PREFIX) else None
            try:
                module = model.get_submodule(path) if path else None
            except AttributeError:
                module = None
            if not isinstance(module, nn.Linear):
                raise ValueError(
                    f"adapter key {key} names {path!r}, which is not an nn.Linear of {type(model).__name__}; "
                    "was the adapter trained for another model?"
                )
            self._targets.append((module, self.params[key], self.params[bkey]))
        if not self._targets:
            raise ValueError("the adapter has no LoRA weights")
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=config.lr, betas=config.betas,
                                           eps=config.eps, weight_decay=config.weight_decay)
        self.step = 0
        self._reset_open()
        #: on CUDA, synchronise after each unit so per-layer times include device work (the backward process turns
        #: this on: it synchronises at every boundary anyway to bound preemption latency)
        self.sync_timing = False
        self._kwargs_cache: OrderedDict[int, list[tuple[tuple[Any, ...], dict[str, Any]]]] = OrderedDict()
        self._probe_lock = threading.Lock()
        first = next(iter(model.parameters()))
        self.device = first.device
        self.dtype = first.dtype
        #: tokens per packed unit actually used: 0 when the installed transformers cannot keep packed samples apart
        self.pack_tokens = config.pack_tokens if config.pack_tokens <= 0 or transformers_packs() else 0
        if self.pack_tokens != config.pack_tokens:
            import warnings

            warnings.warn("this transformers version does not build block-diagonal masks from packed position_ids "
                          "(transformers.masking_utils.find_packed_sequence_indices is missing); the backward runs "
                          "one sample per unit. Upgrade transformers (>= 5.16) for packed units.", stacklevel=2)

    # ------------------------------------------------------------------------------------------ pieces

    @contextlib.contextmanager
    def lora_applied(self) -> Iterator[None]:
        """Within the block, the model's targeted linears compute ``W x + B(A(x)) * scaling`` (PEFT's formula)."""
        scaling = self.lora.scaling
        handles = []
        for module, a, b in self._targets:
            def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: torch.Tensor,
                     a: nn.Parameter = a, b: nn.Parameter = b) -> torch.Tensor:
                x = args[0] if args else kwargs["input"]
                if x.dtype != a.dtype:
                    x = x.to(a.dtype)
                return (out + F.linear(F.linear(x, a), b) * scaling).to(out.dtype)

            handles.append(module.register_forward_hook(hook, with_kwargs=True))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def layer_kwargs(self, num_tokens: int | Sequence[int]) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """The ``(args, kwargs)`` the model's forward passes each decoder layer for one unpadded sequence.

        ``num_tokens`` is one length, or the lengths of samples packed into one sequence: then the positions restart
        at every sample and the model's own mask construction (transformers' packed-sequence detection from
        ``position_ids``) keeps each sample's attention inside the sample, as if it ran alone.

        Computed by running the model's own forward on zeros with the layers swapped for recording probes (cheap:
        rotary embedding, mask construction and the final norm only); single lengths are cached.
        """
        lengths = (int(num_tokens),) if isinstance(num_tokens, int) else tuple(int(n) for n in num_tokens)
        key = lengths[0] if len(lengths) == 1 else None
        if key is not None:
            hit = self._kwargs_cache.get(key)
            if hit is not None:
                self._kwargs_cache.move_to_end(key)
                return hit
        store: list[Any] = [None] * self.num_layers
        probes = nn.ModuleList([_Probe(layer, i, store) for i, layer in enumerate(self.layers)])
        hidden = self.model.config.hidden_size
        total = sum(lengths)
        extra: dict[str, Any] = {}
        if len(lengths) > 1:
            extra["position_ids"] = torch.cat([torch.arange(n, device=self.device) for n in lengths])[None]
        with self._probe_lock, torch.no_grad():
            self.decoder.layers = probes
            try:
                embeds = torch.zeros(1, total, hidden, dtype=self.dtype, device=self.device)
                self.decoder(inputs_embeds=embeds, use_cache=False, **extra)
            finally:
                self.decoder.layers = self.layers
        if any(s is None for s in store):
            raise NotImplementedError(f"{type(self.model).__name__}'s forward did not call every decoder layer")
        if key is not None:
            self._kwargs_cache[key] = store
            if len(self._kwargs_cache) > 32:  # eager attention keeps an [n, n] mask per entry
                self._kwargs_cache.popitem(last=False)
        return store

    def units(self, samples: Sequence[CapturedSample]) -> list[list[int]]:
        """Indices of ``samples`` grouped into packed units, in order (see :attr:`TrainerConfig.pack_tokens`)."""
        return pack_groups([s.num_tokens for s in samples], self.pack_tokens)

    def _loss_sum(self, top_out: torch.Tensor, sample: CapturedSample, total_targets: int) -> torch.Tensor:
        """Causal-LM loss of one sample's targets divided by the batch's target count (HF's formula)."""
        mask = sample.loss_mask[1:].to(self.device, non_blocking=True)
        ids = sample.input_ids.to(self.device, non_blocking=True)
        if self.config.head_on_targets_only:
            # only rows that predict a target go through the (vocabulary-sized) head: same loss up to rounding
            pos = mask.nonzero().squeeze(1)
            logits = self.head(self.norm(top_out[0].index_select(0, pos))).float()
            return F.cross_entropy(logits, ids[1:].index_select(0, pos), reduction="sum") / total_targets
        # every row through the head, as transformers does: keeps the result bit-identical to the reference loop
        logits = self.head(self.norm(top_out)).float()[0]
        labels = torch.where(mask, ids[1:], -100)
        return F.cross_entropy(logits[:-1], labels, ignore_index=-100, reduction="sum") / total_targets

    def _loss_packed(self, top_out: torch.Tensor, unit: Sequence[CapturedSample], total_targets: int) -> torch.Tensor:
        """:meth:`_loss_sum` of samples packed into one sequence: each row predicts the next token of its own sample."""
        if len(unit) == 1:
            return self._loss_sum(top_out, unit[0], total_targets)
        ignore = torch.full((1,), -100, dtype=torch.long, device=self.device)
        # a sample's last row predicts nothing (it would otherwise "predict" the next sample's first token)
        labels = torch.cat([piece for s in unit for piece in (
            torch.where(s.loss_mask[1:], s.input_ids[1:], -100).to(self.device, non_blocking=True), ignore)])
        rows = top_out[0]
        if self.config.head_on_targets_only:
            pos = (labels != -100).nonzero().squeeze(1)
            rows, labels = rows.index_select(0, pos), labels.index_select(0, pos)
        logits = self.head(self.norm(rows)).float()
        return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / total_targets

    # ------------------------------------------------------------------------------------------ training

    def backward(self, samples: Sequence[CapturedSample], grant: Callable[[], object] | None = None, *,
                 normalizer: int | None = None) -> tuple[float, tuple[float, ...]]:
        """Accumulate the gradients of one backward batch into the LoRA parameters' ``.grad``.

        The loss is normalised by the batch's total target tokens, so call it once per optimizer step with the
        whole batch. ``grant`` is called at every boundary between units of work -- before each (layer, unit)
        recompute+backward and before each unit's output head, a unit being the samples packed together (see
        :attr:`TrainerConfig.pack_tokens`) -- so a paused backward holds the device for at most one layer of one
        unit; it blocks while inference holds the device and may raise
        :class:`BackwardCancelled`. Returns ``(loss, seconds per layer summed over samples, pauses excluded)``; with
        :attr:`sync_timing` on CUDA those include the device work, else only the launches. ``normalizer`` divides
        the summed token losses instead of the batch's own target count (:meth:`accumulate` passes 1).
        """
        total_targets = sum(s.num_targets for s in samples)
        if total_targets == 0:
            raise ValueError("backward batch has no target tokens (every loss_mask[1:] is False); nothing to train")
        if normalizer is not None:
            total_targets = normalizer
        live = [s for s in samples if s.num_targets > 0]
        units = [[live[i] for i in group] for group in self.units(live)]
        kwargs = [self.layer_kwargs([s.num_tokens for s in unit]) for unit in units]
        grads: list[torch.Tensor | None] = [None] * len(units)
        loss_acc = torch.zeros((), dtype=torch.float32, device=self.device)
        layer_times = [0.0] * self.num_layers
        top = self.num_layers - 1
        sync = self.sync_timing and self.device.type == "cuda"
        with torch.enable_grad(), self.lora_applied(), attention_without_cudnn(self.device):
            for li in range(top, -1, -1):
                layer = self.layers[li]
                need_input_grad = li > 0
                for u, unit in enumerate(units):
                    if grant is not None:
                        grant()
                    t0 = time.perf_counter()
                    if len(unit) == 1:
                        x = unit[0].hidden[li].to(self.device, non_blocking=True)
                    else:
                        x = torch.cat([s.hidden[li].to(self.device, non_blocking=True) for s in unit])
                    x = x.detach().unsqueeze(0)
                    if need_input_grad:
                        x.requires_grad_(True)
                    args, kw = kwargs[u][li]
                    out = layer(x, *args, **kw)
                    if isinstance(out, tuple):
                        out = out[0]
                    if li == top:
                        # The head + loss is its own unit (for big vocabularies it costs more than a layer): cut the
                        # graph at the layer output so the grant can be checked in between. The chain rule is
                        # applied in the same order with the same tensors, so the result is bit-identical.
                        h = out.detach().requires_grad_(True)
                        loss = self._loss_packed(h, unit, total_targets)
                        loss.backward()
                        loss_acc += loss.detach()
                        if sync:
                            torch.cuda.synchronize(self.device)
                        layer_times[li] += time.perf_counter() - t0
                        if grant is not None:
                            grant()
                        t0 = time.perf_counter()
                        out.backward(h.grad)
                    else:
                        out.backward(grads[u])
                    grads[u] = x.grad if need_input_grad else None
                    if sync:
                        torch.cuda.synchronize(self.device)
                    layer_times[li] += time.perf_counter() - t0
        return float(loss_acc), tuple(layer_times)

    def accumulate(self, samples: Sequence[CapturedSample], grant: Callable[[], object] | None = None) -> float:
        """Add one part of an optimizer step's batch to the step's gradients; returns the part's summed token loss.

        The controller sends a large optimizer step in parts as their captures complete, so the backward of the
        first parts runs while the engine still forwards the later ones (all with the same adapter: the step is
        applied once, by :meth:`apply_accumulated`). Token losses are summed here and the sum of gradients is divided
        by the step's target count once at the end, which is the gradient of the mean loss over the whole batch: the
        update of one :meth:`train_step` over all parts, up to rounding. If ``grant`` raises, the whole open step is
        dropped (:meth:`drop_accumulated`) and the adapter is unchanged."""
        if not self._open:
            self.optimizer.zero_grad(set_to_none=True)
        try:
            loss_sum, layer_times = self.backward(samples, grant, normalizer=1)
        except BaseException:
            self.drop_accumulated()
            raise
        self._open.extend(samples_meta(samples))
        self._open_loss += loss_sum
        self._open_time += sum(layer_times)
        return loss_sum

    def apply_accumulated(self, grant: Callable[[], object] | None = None) -> StepResult:
        """Apply the optimizer step whose parts :meth:`accumulate` gathered."""
        if not self._open:
            raise ValueError("no accumulated gradients to apply: accumulate() at least one part first")
        t0 = time.perf_counter()
        targets = sum(t for _, _, t in self._open)
        scale = 1.0 / targets
        for p in self.params.values():
            if p.grad is not None:
                p.grad.mul_(scale)
        if grant is not None:
            grant()
        loss = self._open_loss / targets
        if math.isfinite(loss):
            nonfinite = self.optimizer_step()
        else:
            self.optimizer.zero_grad(set_to_none=True)
            nonfinite = "loss"
        result = StepResult(step=self.step, loss=loss,
                            sample_ids=tuple(i for i, _, _ in self._open), tokens=sum(n for _, n, _ in self._open),
                            target_tokens=targets, duration_s=self._open_time + time.perf_counter() - t0,
                            nonfinite=nonfinite)
        self._reset_open()
        return result

    def drop_accumulated(self) -> tuple[int, ...]:
        """Abandon the open step (its gradients); returns the ids of the samples it held."""
        ids = tuple(i for i, _, _ in self._open)
        self.optimizer.zero_grad(set_to_none=True)
        self._reset_open()
        return ids

    @property
    def accumulated_ids(self) -> tuple[int, ...]:
        return tuple(i for i, _, _ in self._open)

    def accumulated_totals(self) -> tuple[tuple[int, ...], int, int, float]:
        """The open step's (sample ids, tokens, target tokens, summed token losses): a data-parallel rank's share
        of a global step (:mod:`deltaserve_core.data_parallel`)."""
        return (self.accumulated_ids, sum(n for _, n, _ in self._open), sum(t for _, _, t in self._open),
                self._open_loss)

    def _reset_open(self) -> None:
        self._open: list[tuple[int, int, int]] = []  # (sample id, tokens, target tokens) of the open step
        self._open_loss = 0.0
        self._open_time = 0.0

    def nonfinite_gradients(self) -> bool:
        """Whether any accumulated LoRA gradient holds a NaN or an infinity."""
        return not all_finite(p.grad for p in self.params.values())

    def optimizer_step(self) -> str:
        """Apply AdamW to the accumulated gradients (in place on the shared adapter tensors); ``""`` on success.

        A step whose gradients or resulting weights are not finite does not land: the weights and the optimizer
        state are put back as they were, the gradients are dropped, :attr:`step` does not advance, and the return
        value says what was not finite ("gradients" or "weights"). A NaN written into the shared adapter would
        otherwise reach the host's next forward, every later step and any checkpoint or published version."""
        if self.nonfinite_gradients():
            self.optimizer.zero_grad(set_to_none=True)
            return "gradients"
        if self.config.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(list(self.params.values()), self.config.max_grad_norm)
        saved = self._snapshot_for_step()
        try:
            self.optimizer.step()
        except BaseException as exc:
            # AdamW updates tensor by tensor, so a failure part-way leaves some weights stepped: put all back
            self._restore_after_step(saved)
            self.optimizer.zero_grad(set_to_none=True)
            if isinstance(exc, RuntimeError) and "overflow" in str(exc):
                return "weights"  # torch refuses an update too large for the weights' dtype (a huge lr)
            raise
        if not all_finite(self.params.values()):
            self._restore_after_step(saved)
            self.optimizer.zero_grad(set_to_none=True)
            return "weights"
        self.step += 1
        return ""

    def _snapshot_for_step(self) -> tuple[list[torch.Tensor], dict[int, dict[str, Any]]]:
        # Copies of what a step changes: the LoRA weights and AdamW's moments (a few times the adapter's size,
        # small next to the base model), so a step that overflows can be undone exactly.
        weights = [p.detach().clone() for p in self.params.values()]
        moments = {id(p): {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()}
                   for p, st in self.optimizer.state.items()}
        return weights, moments

    def _restore_after_step(self, saved: tuple[list[torch.Tensor], dict[int, dict[str, Any]]]) -> None:
        weights, moments = saved
        with torch.no_grad():
            for p, w in zip(self.params.values(), weights):
                p.copy_(w)
        for p in list(self.optimizer.state):
            old = moments.get(id(p))
            if old is None:  # the step created this state (first step): without it AdamW starts afresh next time
                del self.optimizer.state[p]
            else:
                for k, v in old.items():
                    cur = self.optimizer.state[p].get(k)
                    if torch.is_tensor(cur) and torch.is_tensor(v):
                        cur.copy_(v)
                    else:
                        self.optimizer.state[p][k] = v

    def train_step(self, samples: Sequence[CapturedSample], grant: Callable[[], object] | None = None) -> StepResult:
        """One optimizer step over one backward batch: zero grads, :meth:`backward`, AdamW.

        Called by the backward process for each ``train`` command. If ``grant`` raises, the gradients are dropped
        and the adapter is unchanged. A batch whose loss, gradients or updated weights are not finite is skipped
        the same way, and :attr:`StepResult.nonfinite` says which (see :meth:`optimizer_step`).
        """
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        try:
            loss, layer_times = self.backward(samples, grant)
        except BaseException:
            self.optimizer.zero_grad(set_to_none=True)
            raise
        if grant is not None:
            grant()
        if math.isfinite(loss):
            nonfinite = self.optimizer_step()
        else:
            self.optimizer.zero_grad(set_to_none=True)
            nonfinite = "loss"
        return StepResult(step=self.step, loss=loss, sample_ids=tuple(s.sample_id for s in samples),
                          tokens=sum(s.num_tokens for s in samples),
                          target_tokens=sum(s.num_targets for s in samples),
                          duration_s=time.perf_counter() - t0, layer_times_s=layer_times, nonfinite=nonfinite)

    # ------------------------------------------------------------------------------------------ state

    def adapter_state(self, version: int | None = None, name: str | None = None) -> LoraAdapterState:
        """A detached copy of the current weights (what the controller hands to ``set_finetune_adapter``)."""
        return LoraAdapterState(name or self.adapter_name, self.step if version is None else version, self.lora,
                                {k: p.detach().clone() for k, p in self.params.items()}, self.base_model_path)

    def load_adapter_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Overwrite the trainable weights in place (resume from a checkpoint)."""
        missing = set(self.params) ^ set(tensors)
        if missing:
            raise ValueError(f"adapter keys differ from the trainer's: {sorted(missing)[:4]}")
        with torch.no_grad():
            for k, p in self.params.items():
                p.copy_(tensors[k])

    def optimizer_state(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: Mapping[str, Any], step: int) -> None:
        self.optimizer.load_state_dict(dict(state))
        self.step = int(step)

    @torch.no_grad()
    def forward_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Full forward of ``input_ids`` (``[n]``) with the current adapter; ``[n, vocab]`` logits. For tests/evals."""
        with self.lora_applied():
            return self.model(input_ids=input_ids.to(self.device)[None], use_cache=False).logits[0]
