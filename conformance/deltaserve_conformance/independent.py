"""The suite's own model: plain transformers + PEFT, written without any of the host's (or the core's) code paths.

Checks compare what a host did with this, never with the host's own client path: a bug shared by two host paths
(a LoRA scaling slip in the adapter loader, say) cancels out when one path is compared with the other, and shows
here. Greedy outputs are judged by teacher forcing: one forward over prompt + the host's tokens, and every token the
host produced must be the reference's argmax at its position, up to a near-tie allowance (two logits closer than
the dtype's noise may legitimately flip between kernels).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from deltaserve_core.adapter_state import LoraAdapterState

__all__ = ["GreedyMismatch", "IndependentModel"]

#: Logit gap under which two candidates count as tied (relative to 1 + |max logit|), per activation dtype.
_TIE = {"float32": 2e-4, "bfloat16": 5e-2, "float16": 1e-2}


@dataclass(frozen=True)
class GreedyMismatch:
    """Where a host's greedy output left the reference's: position in the output, both tokens and their logits."""

    position: int
    got: int
    expected: int
    got_logit: float
    best_logit: float

    def describe(self) -> str:
        return (f"output token {self.position} is {self.got} (reference logit {self.got_logit:.4f}) but transformers+"
                f"PEFT's greedy choice is {self.expected} (logit {self.best_logit:.4f})")


class IndependentModel:
    """transformers + PEFT on CPU in fp32, one model per adapter (``None``: the base model); ``dtype`` is the
    host's, and sets how close two logits may be to count as a near-tie. :meth:`layer_inputs` can also run the
    same reference in the host's dtype: how far that lands from fp32 is the dtype's own noise, which a
    reduced-precision host is allowed (its rounding grows with depth)."""

    def __init__(self, model_dir: Path, dtype: str = "float32") -> None:
        self.model_dir = Path(model_dir)
        self.tie = _TIE[dtype]
        self._models: dict[object, torch.nn.Module] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="deltaserve-conformance-ref-")
        self._saved = 0

    def _base(self, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=dtype).eval()

    def model(self, adapter: LoraAdapterState | Path | None, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        """The reference for ``adapter``: a PEFT folder, an in-memory state (snapshotted now), or the base model.

        States are keyed by identity *and* a fingerprint of their tensors, so a state edited in place after it was
        first used is a different reference (the checks mean the weights as they were when handed to the host)."""
        key: object = None if adapter is None else (str(adapter) if isinstance(adapter, Path)
                                                     else (id(adapter), fingerprint(adapter)))
        if dtype != torch.float32:
            key = (key, str(dtype))
        cached = self._models.get(key)
        if cached is not None:
            return cached
        from peft import PeftModel

        base = self._base(dtype)
        if adapter is None:
            model = base
        else:
            folder = adapter
            if isinstance(adapter, LoraAdapterState):
                self._saved += 1
                folder = adapter.save_pretrained(Path(self._tmp.name) / f"a{self._saved}")
            # in a reduced dtype the adapter stays in it too (PEFT would upcast it to fp32), as an engine's LoRA
            # kernels run it: the noise this reference measures is then the dtype's, not half of it
            model = PeftModel.from_pretrained(base, str(folder),
                                              autocast_adapter_dtype=dtype == torch.float32).eval()
        self._models[key] = model
        return model

    def layer_inputs(self, adapter: LoraAdapterState | Path | None, input_ids: Sequence[int],
                     dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        """Residual-stream input of every decoder layer, ``[num_tokens, hidden]`` each (fp32 values)."""
        model = self.model(adapter, dtype)
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        captured: list[torch.Tensor] = []
        handles = [layer.register_forward_pre_hook(lambda m, args, kw: captured.append(
            (args[0] if args else kw["hidden_states"])[0].detach().float().clone()), with_kwargs=True)
            for layer in inner.model.layers]
        try:
            with torch.no_grad():
                model(input_ids=torch.tensor([list(input_ids)]))
        finally:
            for h in handles:
                h.remove()
        return captured

    def greedy_mismatch(self, adapter: LoraAdapterState | Path | None, prompt: Sequence[int],
                        output: Sequence[int]) -> GreedyMismatch | None:
        """The first output token that is not the reference's greedy choice (near-ties allowed), or None."""
        if not output:
            return None
        model = self.model(adapter)
        ids = list(prompt) + list(output[:-1])
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, len(prompt) - 1:].float()
        for i, tok in enumerate(output):
            row = logits[i]
            best = int(row.argmax())
            if tok == best:
                continue
            if not 0 <= tok < row.shape[0]:
                return GreedyMismatch(i, int(tok), best, float("nan"), float(row[best]))
            gap = float(row[best] - row[tok])
            if gap > self.tie * (1.0 + abs(float(row[best]))):
                return GreedyMismatch(i, int(tok), best, float(row[tok]), float(row[best]))
        return None

    def forward_seconds(self, lengths: Sequence[int], device: str, vocab: int, repeats: int = 3) -> float:
        """Best-of-``repeats`` wall time of a plain base-model forward of one sequence per length, on ``device``.

        The lower bound for a host's step time: an engine may be faster than eager transformers, but not by more
        than the factor the check allows."""
        from transformers import AutoModelForCausalLM

        key = ("timing", device)
        model = self._models.get(key)
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).to(device).eval()
            self._models[key] = model
        gen = torch.Generator().manual_seed(0)
        batches = [torch.randint(3, vocab, (1, n), generator=gen).to(device) for n in lengths]
        best = float("inf")
        with torch.no_grad():
            for _ in range(repeats):
                _sync(device)
                start = time.perf_counter()
                for ids in batches:
                    model(input_ids=ids)
                _sync(device)
                best = min(best, time.perf_counter() - start)
        return best


def fingerprint(state: LoraAdapterState) -> tuple[tuple[str, float, float], ...]:
    """A cheap content digest of an adapter's tensors (sum and sum of squares per key, in float64)."""
    return tuple((k, float(v.double().sum()), float(v.double().square().sum())) for k, v in sorted(state.tensors.items()))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
