"""Shared helpers for the proofs: a tiny model (same recipe as the suite's, own cache folder), recording core-side
objects, a transformers + PEFT oracle for layer inputs, and ``run_proof`` (broken must fail, reference must pass)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
import importlib
import json
import os
import sys
import threading
import time
from pathlib import Path

_BATCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_BATCH))

import torch

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.driver import ClientRequest, HostConfig
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
from deltaserve_core.testing.reference_host import ReferenceHost
from deltaserve_core.testing.tiny_model import build_lora_adapter, build_tiny_llama
from deltaserve_core.types import FineTuneSample

ROOT = Path(os.environ.get("BLIND_CACHE", "/tmp/deltaserve-blind-cache"))
MODEL = build_tiny_llama(ROOT / "tiny-llama")
CLIENT = build_lora_adapter(MODEL, ROOT / "client-adapter", seed=1)
FT = build_lora_adapter(MODEL, ROOT / "finetune-adapter", seed=2, r=8)
FT_MLP = build_lora_adapter(MODEL, ROOT / "finetune-adapter-mlp", seed=3, r=8,
                            target_modules=("q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"))
VOCAB = 460
HIDDEN = 128
LAYERS = 2


def ft_state(path=FT, version=0, name="ft") -> LoraAdapterState:
    return LoraAdapterState.load_pretrained(path, name=name, version=version)


def make(cls, state=None, **cfg):
    config = HostConfig(model=str(MODEL), max_lora_rank=16, client_adapters={"client": str(CLIENT)}, **cfg)
    host = cls(config)
    host.set_finetune_adapter(state if state is not None else ft_state())
    return host


def sample(sid: int, n: int, seed: int | None = None) -> FineTuneSample:
    g = torch.Generator().manual_seed(1000 + sid if seed is None else seed)
    ids = tuple(torch.randint(3, VOCAB, (n,), generator=g).tolist())
    return FineTuneSample(sid, ids, (False,) + (True,) * (n - 1))


def prompt(n: int, seed: int = 0) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(3, VOCAB, (n,), generator=g).tolist())


class Interceptor:
    """policy(batch, k) -> samples, where k counts on_schedule calls."""

    def __init__(self, policy=None):
        self.policy = policy or (lambda b, k: ())
        self.batches = []
        self.returned = {}
        self.arrivals = []
        self.lock = threading.Lock()

    def on_schedule(self, batch):
        k = len(self.batches)
        self.batches.append(batch)
        out = tuple(self.policy(batch, k))
        self.returned.setdefault(batch.step_id, []).append(out)
        return out

    def on_arrival(self, request_id, arrival_time):
        with self.lock:
            self.arrivals.append((request_id, arrival_time, time.monotonic()))


class Sink:
    """Records every call in order; abort(step_id, k) decides should_abort (k counts calls in the step)."""

    def __init__(self, abort=None, on_begin=None):
        self.abort = abort or (lambda s, k: False)
        self.on_begin = on_begin
        self.events = []
        self._k = {}

    def begin_step(self, step_id, samples):
        self.events.append(("begin", step_id, tuple(s.sample_id for s in samples)))
        if self.on_begin:
            self.on_begin(step_id, samples)

    def layer_input(self, step_id, layer, sample_id, hidden):
        self.events.append(("layer", step_id, layer, sample_id, hidden.detach().clone()))

    def should_abort(self, step_id):
        k = self._k.get(step_id, 0)
        self._k[step_id] = k + 1
        out = bool(self.abort(step_id, k))
        self.events.append(("abort?", step_id, k, out))
        return out

    def end_step(self, step_id, completed, aborted):
        self.events.append(("end", step_id, tuple(completed), tuple(aborted)))

    def layers(self, step_id=None):
        return [e for e in self.events if e[0] == "layer" and (step_id is None or e[1] == step_id)]


class Steps:
    def __init__(self):
        self.records = []

    def __call__(self, record):
        self.records.append(record)

    def by_step(self, step_id):
        return [r for r in self.records if r.step_id == step_id]


def install(host, policy=None, abort=None, on_begin=None):
    icp, sink, steps = Interceptor(policy), Sink(abort, on_begin), Steps()
    host.intercept_schedule(icp)
    host.capture_activation(sink)
    host.report_step_time(steps)
    return icp, sink, steps


_PEFT = {}


def peft_layer_inputs(input_ids, state: LoraAdapterState):
    """Inputs of every decoder layer for one sample under base + state's LoRA, from transformers + PEFT."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    key = (state.config.r, state.config.lora_alpha, state.config.target_modules)
    if key not in _PEFT:
        base = AutoModelForCausalLM.from_pretrained(str(MODEL), dtype=torch.float32).eval()
        _PEFT[key] = get_peft_model(base, LoraConfig(r=state.config.r, lora_alpha=state.config.lora_alpha,
                                                     target_modules=list(state.config.target_modules),
                                                     lora_dropout=0.0, task_type="CAUSAL_LM"))
    model = _PEFT[key]
    set_peft_model_state_dict(model, {k: v.clone() for k, v in state.tensors.items()})
    with torch.no_grad():
        out = model(torch.tensor([list(input_ids)]), output_hidden_states=True)
    return [h[0] for h in out.hidden_states[:LAYERS]]


def check_captures(sink, samples_by_id, state, step_id=None, atol=1e-4):
    """Every captured layer input equals PEFT's; every (layer, sample) captured exactly once."""
    problems = []
    seen = {}
    for _, sid_step, layer, sid, h in sink.layers(step_id):
        seen[(sid_step, layer, sid)] = seen.get((sid_step, layer, sid), 0) + 1
        smp = samples_by_id.get(sid)
        if smp is None:
            problems.append(f"capture for unknown sample {sid}")
            continue
        ref = peft_layer_inputs(smp.input_ids, state)[layer]
        if tuple(h.shape) != tuple(ref.shape):
            problems.append(f"step {sid_step} layer {layer} sample {sid}: shape {tuple(h.shape)} != {tuple(ref.shape)}")
        elif not torch.allclose(h.float(), ref, atol=atol, rtol=1e-4):
            problems.append(f"step {sid_step} layer {layer} sample {sid}: max err {(h.float() - ref).abs().max():.3g}")
    for smp in samples_by_id.values():
        for layer in range(LAYERS):
            if not any(k[1] == layer and k[2] == smp.sample_id for k in seen):
                problems.append(f"layer {layer} sample {smp.sample_id}: never captured")
    if any(v != 1 for v in seen.values()):
        problems.append(f"captured more than once: {[k for k, v in seen.items() if v != 1]}")
    return (not problems), "; ".join(problems[:4]) or "captures equal transformers+PEFT"


def drain(host, limit=200):
    outs = []
    for _ in range(limit):
        if not host.has_unfinished():
            break
        outs.extend(host.step())
    return outs


def load(spec: str):
    mod, _, attr = spec.partition(":")
    return getattr(importlib.import_module(mod), attr or "Host")


def run_proof(name: str, rule: str, check, broken: str, extra_passing=()):
    """check(cls) -> (passes, detail). Exit 0 iff the reference (and extra controls) pass and the broken host fails."""
    results = {}
    for label, cls in [("reference", ReferenceHost)] + [(s, load(s)) for s in extra_passing] + [(broken, load(broken))]:
        t0 = time.monotonic()
        try:
            ok, detail = check(cls)
        except Exception as exc:  # a crash is a failed check
            ok, detail = False, f"raised {type(exc).__name__}: {exc}"
        results[label] = {"passes": bool(ok), "detail": detail, "s": round(time.monotonic() - t0, 1)}
        print(f"[{name}] {label}: {'PASS' if ok else 'FAIL'} -- {detail}", flush=True)
    demonstrated = all(v["passes"] for k, v in results.items() if k != broken) and not results[broken]["passes"]
    print(f"[{name}] rule: {rule}\n[{name}] violation demonstrated: {demonstrated}")
    out = _BATCH / "proofs" / "results"
    out.mkdir(exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"name": name, "rule": rule, "broken": broken,
                                                  "demonstrated": demonstrated, "results": results}, indent=2))
    sys.exit(0 if demonstrated else 1)


__all__ = [n for n in dir() if not n.startswith("_")]
