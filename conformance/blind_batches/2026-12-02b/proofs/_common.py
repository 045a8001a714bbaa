"""Shared helpers for the proofs of batch 2026-12-02b (written without reading the conformance suite).

Each proof runs one check against the reference host and against one broken host; it exits 0 when the
reference passes and the broken host fails.
"""
from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from deltaserve_core.adapter_state import LoraAdapterState, fresh_lora_state
from deltaserve_core.driver import ClientRequest, HostConfig
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
from deltaserve_core.lora_spec import LoraConfigSpec
from deltaserve_core.testing.reference_host import ReferenceHost
from deltaserve_core.testing.tiny_model import build_tiny_llama
from deltaserve_core.types import FineTuneSample

CACHE = Path(os.environ.get("BLIND_CACHE", "/tmp/deltaserve-blind-cache2"))
torch.set_num_threads(1)


def model_dir() -> str:
    return str(build_tiny_llama(CACHE / "tiny-llama"))


def config(**kw) -> HostConfig:
    return HostConfig(model=model_dir(), **kw)


def make(cls, **kw):
    return cls(config(**kw))


def broken(nn: str):
    pkg = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(pkg))
    for name in os.listdir(pkg / "blindhosts"):
        if name.startswith(f"h{nn}_") and name.endswith(".py"):
            return importlib.import_module(f"blindhosts.{name[:-3]}").Host
    raise SystemExit(f"no host h{nn}")


def lora_state(name="ft", seed=0, scale=0.05, targets=("q_proj", "k_proj", "v_proj", "o_proj"), r=8, version=0):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir(), dtype=torch.float32)
    st = fresh_lora_state(base, LoraConfigSpec(r=r, lora_alpha=16.0, target_modules=tuple(targets)), name=name,
                          seed=seed, base_model_path=model_dir())
    g = torch.Generator().manual_seed(seed + 100)
    tensors = {k: (torch.randn(v.shape, generator=g) * scale if "lora_B" in k else v.clone())
               for k, v in st.tensors.items()}
    return LoraAdapterState(name, version, st.config, tensors, st.base_model_path)


def truth_layer_inputs(state: LoraAdapterState | None, ids) -> list[torch.Tensor]:
    """Residual-stream input of every decoder layer, computed by transformers (+PEFT) independently."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir(), dtype=torch.float32).eval()
    if state is not None:
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

        model = get_peft_model(model, LoraConfig(r=state.config.r, lora_alpha=state.config.lora_alpha,
                                                 target_modules=list(state.config.target_modules), lora_dropout=0.0))
        set_peft_model_state_dict(model, dict(state.tensors))
        model.eval()
    with torch.no_grad():
        out = model(torch.tensor([list(ids)]), output_hidden_states=True)
    n = len(out.hidden_states) - 1
    return [out.hidden_states[i][0] for i in range(n)]


def sample(sid: int, n: int, seed: int = 0) -> FineTuneSample:
    g = torch.Generator().manual_seed(1000 + sid + seed)
    ids = tuple(torch.randint(3, 400, (n,), generator=g).tolist())
    return FineTuneSample(sid, ids, (False,) + (True,) * (n - 1))


def prompt(n: int, seed: int = 0) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(5000 + seed)
    return tuple(torch.randint(3, 400, (n,), generator=g).tolist())


class Interceptor:
    """Hands out queued sample lists, one list per on_schedule call (or a policy function)."""

    def __init__(self, plan=None, policy=None):
        self.plan = list(plan or [])
        self.policy = policy
        self.batches = []
        self.arrivals = []

    def on_schedule(self, batch):
        self.batches.append(batch)
        if self.policy is not None:
            return self.policy(batch)
        return self.plan.pop(0) if self.plan else ()

    def on_arrival(self, request_id, arrival_time):
        self.arrivals.append((request_id, arrival_time, time.monotonic()))


class Sink:
    def __init__(self, abort=None):
        self.events = []
        self.inputs = {}
        self.abort = abort  # callable(step_id, calls) -> bool
        self.abort_calls = 0

    def begin_step(self, step_id, samples):
        self.events.append(("begin", step_id, tuple(s.sample_id for s in samples)))

    def layer_input(self, step_id, layer, sample_id, hidden):
        self.events.append(("input", step_id, layer, sample_id))
        self.inputs[(step_id, layer, sample_id)] = hidden.detach().clone()

    def should_abort(self, step_id):
        self.abort_calls += 1
        self.events.append(("abort?", step_id))
        return bool(self.abort and self.abort(step_id, self.abort_calls))

    def end_step(self, step_id, completed, aborted):
        self.events.append(("end", step_id, tuple(completed), tuple(aborted)))


class Records(list):
    def __call__(self, record):
        self.append(record)


def install(host, plan=None, policy=None, abort=None, adapter=True):
    ic, sink, recs = Interceptor(plan, policy), Sink(abort), Records()
    if adapter:
        host.set_finetune_adapter(adapter if isinstance(adapter, LoraAdapterState) else lora_state())
    host.intercept_schedule(ic)
    host.capture_activation(sink)
    host.report_step_time(recs)
    return ic, sink, recs


def close(a, b, tol=2e-4) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, atol=tol, rtol=tol)


def verdict(check, nn: str) -> int:
    """Run check(HostClass) -> (ok, detail) on the reference and on broken host nn; exit code."""
    results = {}
    for label, cls in (("reference", ReferenceHost), ("broken", broken(nn))):
        t = time.monotonic()
        try:
            ok, detail = check(cls)
        except Exception as e:  # a crash is a failure of that host
            ok, detail = False, f"raised {type(e).__name__}: {e}"
            if os.environ.get("BLIND_DEBUG"):
                traceback.print_exc()
        results[label] = ok
        print(f"[p{nn}] {label}: {'PASS' if ok else 'FAIL'} ({time.monotonic() - t:.1f}s) {detail}")
    good = results["reference"] and not results["broken"]
    print(f"[p{nn}] proof {'holds' if good else 'DOES NOT hold'}")
    return 0 if good else 1


def check_captures(sink, samples, state=None, extra_ok=False):
    """Every (layer, sample) captured once, equal to transformers' layer input; nothing else captured."""
    state = state if state is not None else lora_state()
    want = set()
    for s in samples:
        truth = truth_layer_inputs(state, s.input_ids)
        for li, t in enumerate(truth):
            keys = [k for k in sink.inputs if k[1] == li and k[2] == s.sample_id]
            want.update(keys)
            if len(keys) != 1:
                return False, f"sample {s.sample_id} layer {li}: {len(keys)} captures"
            got = sink.inputs[keys[0]]
            if not close(got, t):
                return False, (f"sample {s.sample_id} layer {li}: capture differs from transformers "
                               f"(shape {tuple(got.shape)} {got.dtype}, want {tuple(t.shape)} {t.dtype})")
    others = set(sink.inputs) - want
    if others and not extra_ok:
        return False, f"unexpected captures {sorted(others)[:4]}"
    return True, "captures match transformers"


def drain(host, limit=200):
    outs = []
    n = 0
    while host.has_unfinished() and n < limit:
        outs.extend(host.step())
        n += 1
    return outs
