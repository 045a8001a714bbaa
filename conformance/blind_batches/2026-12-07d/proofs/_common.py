"""Shared helpers of the proofs: a tiny model, a PEFT adapter, recording hook objects, and independent truth
(transformers + PEFT) for layer inputs and greedy outputs."""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = Path(__file__).resolve().parent
BATCH = HERE.parent
sys.path.insert(0, str(BATCH))

import torch  # noqa: E402

torch.set_num_threads(1)

from deltaserve_core.adapter_state import LoraAdapterState  # noqa: E402
from deltaserve_core.driver import ClientRequest, HostConfig  # noqa: E402
from deltaserve_core.testing.reference_host import ReferenceHost  # noqa: E402
from deltaserve_core.testing.tiny_model import build_lora_adapter, build_tiny_llama  # noqa: E402
from deltaserve_core.types import FineTuneSample  # noqa: E402

CACHE = Path(os.environ.get("BLIND_CACHE", "/tmp/deltaserve-blind-cache12"))


def model_dir(num_layers: int = 2) -> Path:
    return build_tiny_llama(CACHE / f"tiny{num_layers}", num_layers=num_layers)


def adapter_dir(name: str = "ft", seed: int = 1, r: int = 8, targets=("q_proj", "k_proj", "v_proj", "o_proj"),
                num_layers: int = 2) -> Path:
    return build_lora_adapter(model_dir(num_layers), CACHE / f"lora_{name}_{num_layers}_{seed}_{r}", r=r, seed=seed,
                              target_modules=tuple(targets), scale=0.08)


def ft_state(seed: int = 7, r: int = 8, num_layers: int = 2, version: int = 1) -> LoraAdapterState:
    st = LoraAdapterState.load_pretrained(adapter_dir("ft", seed=seed, r=r, num_layers=num_layers), name="job")
    return LoraAdapterState(st.name, version, st.config, dict(st.tensors), st.base_model_path)


def host_module(n: str):
    mods = [p.stem for p in (BATCH / "blindhosts").glob(f"h{n}_*.py")]
    assert len(mods) == 1, mods
    return importlib.import_module(f"blindhosts.{mods[0]}")


def make(cls, num_layers: int = 2, **kw):
    kw.setdefault("seed", 0)
    return cls(HostConfig(model=str(model_dir(num_layers)), **kw))


def sample(sid: int, n: int, seed: int | None = None) -> FineTuneSample:
    g = torch.Generator().manual_seed(1000 + sid if seed is None else seed)
    ids = tuple(torch.randint(3, 400, (n,), generator=g).tolist())
    return FineTuneSample(sid, ids, (False,) + (True,) * (n - 1))


def prompt(n: int, seed: int) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(3, 400, (n,), generator=g).tolist())


class Interceptor:
    """Scripted interceptor: ``plan(batch, call_index) -> samples``; records batches and arrivals."""

    def __init__(self, plan=None):
        self.plan = plan or (lambda b, i: ())
        self.batches = []
        self.arrivals = []

    def on_schedule(self, batch):
        self.batches.append(batch)
        return list(self.plan(batch, len(self.batches) - 1))

    def on_arrival(self, request_id, arrival_time):
        self.arrivals.append((request_id, arrival_time))


class Sink:
    """Recording activation sink; ``abort(step_id, call_index) -> bool`` decides should_abort."""

    def __init__(self, abort=None):
        self.abort = abort or (lambda s, i: False)
        self.events = []  # ("begin", step, ids) / ("layer", step, layer, sid, tensor) / ("abort?", step, ans) / ("end", ...)
        self.n_abort = 0

    def begin_step(self, step_id, samples):
        self.events.append(("begin", step_id, tuple(s.sample_id for s in samples)))

    def layer_input(self, step_id, layer, sample_id, hidden):
        self.events.append(("layer", step_id, layer, sample_id, hidden.detach().clone()))

    def should_abort(self, step_id):
        ans = bool(self.abort(step_id, self.n_abort))
        self.n_abort += 1
        self.events.append(("abort?", step_id, ans))
        return ans

    def end_step(self, step_id, completed, aborted):
        self.events.append(("end", step_id, tuple(completed), tuple(aborted)))

    def layers(self):
        return [e for e in self.events if e[0] == "layer"]


class Records:
    def __init__(self):
        self.records = []

    def __call__(self, record):
        self.records.append(record)


def install(host, plan=None, abort=None):
    ic, sk, rec = Interceptor(plan), Sink(abort), Records()
    host.intercept_schedule(ic)
    host.capture_activation(sk)
    host.report_step_time(rec)
    return ic, sk, rec


_HF = {}


def hf_model(num_layers: int = 2, adapter: Path | None = None, dtype=torch.float32):
    key = (num_layers, str(adapter), str(dtype))
    if key not in _HF:
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(str(model_dir(num_layers)), dtype=dtype).eval()
        if adapter is not None:
            from peft import PeftModel

            m = PeftModel.from_pretrained(m, str(adapter)).eval()
        _HF[key] = m
    return _HF[key]


@torch.no_grad()
def hf_layer_inputs(input_ids, adapter: Path | None, num_layers: int = 2, dtype=torch.float32):
    """Residual-stream input of every decoder layer (hidden_states[i] is the input of layer i)."""
    m = hf_model(num_layers, adapter, dtype)
    out = m(torch.tensor([list(input_ids)]), output_hidden_states=True)
    return [h[0] for h in out.hidden_states[:num_layers]]


@torch.no_grad()
def hf_greedy(prompt_ids, n: int, adapter: Path | None = None, num_layers: int = 2):
    m = hf_model(num_layers, adapter)
    ids = list(prompt_ids)
    out = []
    for _ in range(n):
        logits = m(torch.tensor([ids])).logits[0, -1]
        t = int(logits.argmax())
        out.append(t)
        ids.append(t)
    return out


def close(a, b, tol=1e-4):
    return a.shape == b.shape and bool(torch.allclose(a.float(), b.float(), atol=tol, rtol=tol))


def verdict(tag: str, ref_ok: bool, ref_msg: str, broken_ok: bool, broken_msg: str) -> None:
    print(f"[{tag}] reference: {'PASS' if ref_ok else 'FAIL'} {ref_msg}")
    print(f"[{tag}] broken: {'PASS' if broken_ok else 'FAIL'} {broken_msg}")
    if ref_ok and not broken_ok:
        print(f"[{tag}] proof holds")
        sys.exit(0)
    print(f"[{tag}] proof does NOT hold")
    sys.exit(1)


FT_ADAPTER_SEED = 7


def capture_problems(host, sk, samples, adapter: Path | None = None, tol: float = 1e-4, dtype=torch.float32):
    """What is wrong with the captures of ``samples``: each (layer, sample) exactly once, shape [n, hidden],
    values equal to the PEFT model's residual-stream input of that layer (hidden_states[layer])."""
    L = host.model_spec().num_layers
    adapter = adapter or adapter_dir("ft", seed=FT_ADAPTER_SEED, num_layers=L)
    truth = {s.sample_id: hf_layer_inputs(s.input_ids, adapter, L, dtype) for s in samples}
    seen, bad = {}, []
    for _, step, layer, sid, t in sk.layers():
        seen[(layer, sid)] = seen.get((layer, sid), 0) + 1
        ref = truth[sid][layer]
        if t.shape != ref.shape:
            bad.append(f"layer {layer} sample {sid}: shape {tuple(t.shape)} != {tuple(ref.shape)}")
        elif not close(t, ref, tol):
            bad.append(f"layer {layer} sample {sid}: max |diff| {float((t.float() - ref.float()).abs().max()):.3g}")
    for s in samples:
        for layer in range(L):
            if seen.get((layer, s.sample_id), 0) != 1:
                bad.append(f"layer {layer} sample {s.sample_id}: {seen.get((layer, s.sample_id), 0)} calls")
    return bad


def run(tag: str, check, broken_cls) -> None:
    ok_r, msg_r = check(ReferenceHost)
    ok_b, msg_b = check(broken_cls)
    verdict(tag, ok_r, msg_r, ok_b, msg_b)


# ---------------------------------------------------------------------------------------------- added for 2026-12-03 (kept in 2026-12-04)


def drain(host):
    """Step the host until it has no unfinished request; every output ``step()`` returned, in order."""
    outs = []
    for _ in range(500):
        if not host.has_unfinished():
            return outs
        outs.extend(host.step())
    raise RuntimeError("host did not finish its requests within 500 steps")


def idle_capture(cls, samples, state=None, **kw):
    """A host with the fine-tuning adapter loaded that runs ``samples`` in one fine-tuning-only step."""
    h = make(cls, **kw)
    ic, sk, rec = install(h, plan=lambda b, i: list(samples) if i == 0 else [])
    h.set_finetune_adapter(state if state is not None else ft_state(seed=FT_ADAPTER_SEED))
    ran = h.run_idle_step()
    return h, ic, sk, rec, ran


# ---------------------------------------------------------------------------------------------- added for 2026-12-05


def req(rid: str, n: int, seed: int, max_tokens: int, **kw) -> ClientRequest:
    return ClientRequest(rid, prompt(n, seed), max_tokens, **kw)


def ids_of(requests) -> list[str]:
    return [r.request_id for r in requests]


# ---------------------------------------------------------------------------------------------- added for 2026-12-06

import time  # noqa: E402


def run_with_base(tag: str, check, base_cls, broken_cls) -> None:
    """The reference and the batch's correct base must both pass; the broken host must fail."""
    ok_r, msg_r = check(ReferenceHost)
    ok_b0, msg_b0 = check(base_cls)
    print(f"[{tag}] base {base_cls.__module__}.{base_cls.__name__}: {'PASS' if ok_b0 else 'FAIL'} {msg_b0}")
    ok_b, msg_b = check(broken_cls)
    verdict(tag, ok_r and ok_b0, msg_r, ok_b, msg_b)


def base_module(name: str):
    return importlib.import_module(f"blindhosts.{name}")


def steps_by_id(records):
    return {r.step_id: r for r in records}


# ---------------------------------------------------------------------------------------------- added for 2026-12-06b


def custom_model(tag: str, arch: str = "llama", gen_config: dict | None = None, **overrides) -> Path:
    """A tiny random checkpoint like ``model_dir(2)`` (same tokenizer, init 0.08) with config ``overrides`` (a
    production model shape the 2-layer test model does not have), built once under ``$BLIND_CACHE/custom_<tag>``.
    ``arch="qwen3"`` builds a Qwen3ForCausalLM of the same sizes; ``gen_config`` is written into
    ``generation_config.json`` (as a checkpoint that ships one)."""
    import json
    import shutil

    out = CACHE / f"custom_{tag}"
    marker = out / "custom.json"
    stamp = {"arch": arch, "gen": gen_config or {}, **{k: repr(v) for k, v in overrides.items()}}
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return out
    from transformers import AutoConfig, AutoModelForCausalLM

    base = model_dir(2)
    cfg = AutoConfig.from_pretrained(str(base))
    if arch == "qwen3":
        from transformers import Qwen3Config

        cfg = Qwen3Config(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                          intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
                          num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                          head_dim=cfg.head_dim, max_position_embeddings=cfg.max_position_embeddings,
                          rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=cfg.bos_token_id,
                          eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.5)
            elif "q_norm" in name or "k_norm" in name:
                p.normal_(1.0, 0.3)
    if getattr(cfg, "tie_word_embeddings", False):
        model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for f in base.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, out / f.name)
    if gen_config:
        gpath = out / "generation_config.json"
        g = json.loads(gpath.read_text()) if gpath.is_file() else {}
        g.update(gen_config)
        gpath.write_text(json.dumps(g, indent=2))
    marker.write_text(json.dumps(stamp))
    return out


def make_at(cls, path, **kw):
    kw.setdefault("seed", 0)
    return cls(HostConfig(model=str(path), **kw))


_HFP = {}


@torch.no_grad()
def hf_greedy_at(path, prompt_ids, n: int, adapter=None):
    """Plain transformers (+ PEFT) greedy argmax decoding of ``n`` tokens from the checkpoint at ``path``."""
    key = (str(path), str(adapter))
    if key not in _HFP:
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        if adapter is not None:
            from peft import PeftModel

            m = PeftModel.from_pretrained(m, str(adapter)).eval()
        _HFP[key] = m
    m = _HFP[key]
    ids, out = list(prompt_ids), []
    for _ in range(n):
        t = int(m(torch.tensor([ids])).logits[0, -1].argmax())
        out.append(t)
        ids.append(t)
    return out


# ---------------------------------------------------------------------------------------------- added for 2026-12-07c


def bf16_checkpoint() -> Path:
    """The 2-layer test checkpoint saved in bfloat16 (as Hugging Face checkpoints ship), built once in the cache."""
    import shutil

    out = CACHE / "tiny2_bf16"
    if (out / "config.json").is_file() and (out / "done").is_file():
        return out
    from transformers import AutoModelForCausalLM

    base = model_dir(2)
    m = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    m.save_pretrained(out, safe_serialization=True)
    for f in base.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, out / f.name)
    (out / "done").write_text("1")
    return out


def batches_of(ic, before: int):
    """The batches the interceptor was offered since ``before`` (an earlier ``len(ic.batches)``)."""
    return ic.batches[before:]


# ---------------------------------------------------------------------------------------------- added for 2026-12-07d


EOS_ID = 2  # the test checkpoint's eos_token_id (config.json)


def cut_at_eos(tokens, eos=(EOS_ID,)):
    """Greedy tokens as an ignore_eos=False request must return them: up to and including the first EOS."""
    out = []
    for t in tokens:
        out.append(t)
        if t in eos:
            break
    return out


def step_calls(host, limit: int = 100):
    """step() until nothing is unfinished; the ids each call returned, call by call."""
    calls = []
    for _ in range(limit):
        if not host.has_unfinished():
            return calls
        calls.append([o.request_id for o in host.step()])
    raise RuntimeError("host did not finish within the step limit")
