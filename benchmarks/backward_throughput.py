"""Backward throughput of DeltaServe's exact LoRA backward vs a plain PEFT training step, plus preemption/abort latency.

Usage::

    python benchmarks/backward_throughput.py [--json PATH] [--model tiny|smollm2|llama8b-shape|DIR]
                                             [--device cpu|cuda] [--dtype float32|bfloat16] [--batches N]
                                             [--repeats R] [--trials T] [--skip-latency] [--offload]

What is compared, side by side in one run and on the same batches (order alternated per batch, since run-to-run
noise on a shared CPU is ±30 %):

* ``plain``: :func:`deltaserve_core.peft_steps.plain_peft_step`, i.e. what a user writes with transformers + PEFT:
  per-sample forward with loss, backward, one AdamW step per backward batch (256 tokens by default).
* ``packed``: :func:`deltaserve_core.peft_steps.packed_peft_step`, the same with transformers' padding-free
  packing into sequences of ``pack_tokens`` -- the strongest trainer an operator runs instead (the ``static_mps``
  baseline's), and the rate the backward is judged against.
* ``deltaserve``: :meth:`LoraBackward.train_step` on the layer inputs a host captured: per-layer recompute +
  backward + AdamW, the batch's samples packed into one sequence per layer (the default ``pack_tokens``). This is
  the work the backward process adds; the forward already ran inside the host's batch.
* ``deltaserve_per_sample``: the same with ``pack_tokens=0`` (one sample per unit: bit-identical to ``plain``).
* ``deltaserve_fast``: packed, with ``head_on_targets_only=True`` (output head skipped on prompt rows).
* ``capture``: the host-side forward that produced the captures (PEFT forward + pre-hooks copying each layer input),
  reported so the total cost of a DeltaServe-trained token is visible too.

``ratio`` = deltaserve tokens/s ÷ plain tokens/s, and ÷ packed tokens/s (goal ≥ 0.9 against packed). Tokens are all tokens of the batch (prompt +
response), as the paper counts fine-tuning throughput.

Latencies (skipped with ``--skip-latency``):

* preemption: a spawned :class:`BackwardProcess` trains; at a random moment the grant is cleared; latency =
  child's pause timestamp − clear time (``time.monotonic`` is system-wide). Compared with one layer's backward time
  over the batch, as the child measured it (the grant is checked per layer *and* sample, so the bound is smaller).
* abort: a fine-tuning-only forward runs through :func:`capture_forward`; a timer thread calls
  ``request_abort()``; latency = request → forward stopped (``capture_forward`` returned). Compared with one layer's
  forward time for one sample (the unit between two abort checks here).

``llama8b-shape`` builds a random-weight Llama-3-8B-shaped model on the device (no checkpoint can be fetched here);
random weights run at the same speed as real ones. Writes JSON (default
``benchmarks/results/backward_throughput-<model>-<device>.json``) and prints a summary.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import copy
import json
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from deltaserve_core.activation_buffer import ActivationBuffer  # noqa: E402
from deltaserve_core.adapter_state import LoraAdapterState, LoraConfigSpec  # noqa: E402
from deltaserve_core.bench import source_commit  # noqa: E402
from deltaserve_core.lora_backward import LoraBackward, TrainerConfig  # noqa: E402
from deltaserve_core.model_parts import pack_groups  # noqa: E402
from deltaserve_core.peft_steps import packed_peft_step, plain_peft_step  # noqa: E402
from deltaserve_core.testing.capture import capture_forward  # noqa: E402
from deltaserve_core.types import FineTuneSample  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


# ------------------------------------------------------------------------------------------ setup


def load_base(spec: str, device: torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, str]:
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if spec == "tiny":
        from deltaserve_core.testing.tiny_model import build_tiny_llama

        path = build_tiny_llama(Path(tempfile.gettempdir()) / "deltaserve-bench-tiny", num_layers=4, hidden_size=256,
                                num_heads=4, num_kv_heads=2, intermediate_size=512)
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device), "tiny"
    if spec == "smollm2":
        from deltaserve_core.assets import smollm2_model_path

        path = smollm2_model_path()
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device), "smollm2-135m"
    if spec == "llama8b-shape":
        cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                          rope_theta=500000.0, tie_word_embeddings=False)
        torch.manual_seed(0)
        with torch.device(device):
            model = LlamaForCausalLM(cfg).to(dtype)
        return model, "llama8b-shape"
    return AutoModelForCausalLM.from_pretrained(spec, dtype=dtype).to(device), Path(spec).name


def make_batches(num_batches: int, batch_tokens: int, vocab: int, seed: int = 0) -> list[list[FineTuneSample]]:
    """Alpaca-like samples (lognormal lengths, median ~100 tokens, 30–60 % prompt) grouped like BackwardBatcher."""
    rng = random.Random(seed)
    batches, sid = [], 0
    for _ in range(num_batches):
        batch, tokens = [], 0
        while tokens < batch_tokens:
            n = int(min(256, max(16, rng.lognormvariate(4.6, 0.5))))
            prompt = int(n * rng.uniform(0.3, 0.6))
            batch.append(FineTuneSample(sid, tuple(rng.randrange(vocab) for _ in range(n)),
                                        tuple([False] * prompt + [True] * (n - prompt))))
            sid += 1
            tokens += n
        batches.append(batch)
    return batches


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn):  # noqa: ANN001, ANN201
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


# ------------------------------------------------------------------------------------------ throughput


def throughput(args: argparse.Namespace, base_ref: torch.nn.Module, base_ours: torch.nn.Module,
               device: torch.device, dtype: torch.dtype) -> tuple[dict, LoraAdapterState, list]:
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(base_ref, LoraConfig(r=16, lora_alpha=32, target_modules=list(TARGETS),
                                                     lora_dropout=0.0))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-zero B so every gradient path is live
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_((torch.randn(p.shape, generator=gen) * 0.02).to(p.dtype))
    tensors = {n.replace(".default", ""): p.detach() for n, p in peft_model.named_parameters() if "lora_" in n}
    state = LoraAdapterState("bench", 0, LoraConfigSpec(r=16, lora_alpha=32.0, target_modules=TARGETS), tensors)
    clone = lambda: state.with_tensors({k: v.clone() for k, v in tensors.items()}, version=0)  # noqa: E731
    trainer = LoraBackward(base_ours, clone(), TrainerConfig())
    trainer_unpacked = LoraBackward(base_ours, clone(), TrainerConfig(pack_tokens=0))
    trainer_fast = LoraBackward(base_ours, clone(), TrainerConfig(head_on_targets_only=True))
    ref_opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.01)
    cfg = base_ours.config
    batches = make_batches(args.batches, args.batch_tokens, cfg.vocab_size)
    buffer = ActivationBuffer(cfg.num_hidden_layers, cfg.hidden_size,
                              capacity_tokens=max(sum(s.num_tokens for s in b) for b in batches), dtype=dtype,
                              device=device, offload_to_host=args.offload)
    times: dict[str, list[float]] = {"plain": [], "packed": [], "deltaserve": [], "deltaserve_per_sample": [], "deltaserve_fast": [],
                                     "capture": []}
    tokens_done = 0
    layer_bwd: list[float] = []
    step_id = 0

    def one(batch: list[FineTuneSample], record: bool) -> None:
        nonlocal step_id, tokens_done
        order = ["plain", "packed", "ours"] if step_id % 2 == 0 else ["ours", "packed", "plain"]
        for what in order:
            if what == "plain":
                dt, _ = timed(device, lambda: plain_peft_step(peft_model, ref_opt, batch))
                if record:
                    times["plain"].append(dt)
            elif what == "packed":
                dt, _ = timed(device, lambda: packed_peft_step(peft_model, ref_opt, batch,
                                                               pack_tokens=trainer.config.pack_tokens))
                if record:
                    times["packed"].append(dt)
            else:
                for s in batch:
                    buffer.reserve(s)
                peft_model.eval()
                dt_cap, _ = timed(device, lambda: capture_forward(peft_model, buffer, step_id, batch))
                peft_model.train()
                caps = buffer.captured_many([s.sample_id for s in batch])
                dt, res = timed(device, lambda: trainer.train_step(caps))
                dt_unpacked, _ = timed(device, lambda: trainer_unpacked.train_step(caps))
                dt_fast, _ = timed(device, lambda: trainer_fast.train_step(caps))
                for s in batch:
                    buffer.release(s.sample_id)
                if record:
                    times["capture"].append(dt_cap)
                    times["deltaserve"].append(dt)
                    times["deltaserve_per_sample"].append(dt_unpacked)
                    times["deltaserve_fast"].append(dt_fast)
                    layer_bwd.extend(res.layer_times_s)
        step_id += 1
        if record:
            tokens_done += sum(s.num_tokens for s in batch)

    one(batches[0], record=False)  # warm-up: allocator, kernels, layer-kwargs cache
    for _ in range(args.repeats):
        for batch in batches:
            one(batch, record=True)

    # gradient agreement on one more batch, both sides starting from the same weights
    batch = batches[0]
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_" in n:
                trainer.params[n.replace(".default", "")].copy_(p)
    total = sum(s.num_targets for s in batch)
    peft_model.zero_grad(set_to_none=True)
    for s in batch:
        ids = torch.tensor(s.input_ids, device=device)[None]
        labels = ids.clone()
        labels[0, ~torch.tensor(s.loss_mask, device=device)] = -100
        peft_model(input_ids=ids, labels=labels, num_items_in_batch=total, use_cache=False).loss.backward()
    for s in batch:
        buffer.reserve(s)
    peft_model.eval()
    capture_forward(peft_model, buffer, 10**6, batch)
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.backward(buffer.captured_many([s.sample_id for s in batch]))
    for s in batch:
        buffer.release(s.sample_id)
    grad_err = 0.0
    for n, p in peft_model.named_parameters():
        if "lora_" in n:
            ours = trainer.params[n.replace(".default", "")].grad
            grad_err = max(grad_err, ((ours - p.grad).abs().max() / p.grad.abs().max().clamp_min(1e-30)).item())
    buffer.close()

    def tps(key: str) -> float:
        return tokens_done / sum(times[key])

    out = {
        "tokens_timed": tokens_done,
        "batches": len(batches),
        "repeats": args.repeats,
        "backward_batch_tokens": args.batch_tokens,
        "tokens_per_s": {k: round(tps(k), 2) for k in times},
        "median_step_s": {k: round(statistics.median(v), 5) for k, v in times.items()},
        "ratio_deltaserve_vs_plain": round(tps("deltaserve") / tps("plain"), 4),
        "ratio_deltaserve_vs_packed": round(tps("deltaserve") / tps("packed"), 4),
        "ratio_deltaserve_per_sample_vs_plain": round(tps("deltaserve_per_sample") / tps("plain"), 4),
        "ratio_deltaserve_fast_vs_plain": round(tps("deltaserve_fast") / tps("plain"), 4),
        "ratio_capture_plus_deltaserve_vs_plain": round(
            tokens_done / (sum(times["capture"]) + sum(times["deltaserve"])) / tps("plain"), 4),
        "layer_backward_s_mean": statistics.fmean(layer_bwd),
        "grad_max_rel_err_vs_plain": grad_err,
    }
    return out, state, batches


# ------------------------------------------------------------------------------------------ latency


def abort_latency(args: argparse.Namespace, model: torch.nn.Module, batches: list, device: torch.device,
                  dtype: torch.dtype) -> dict:
    """FT-only step interrupted by an arriving request; host = capture_forward (abort checked per layer)."""
    from peft import LoraConfig, get_peft_model

    cfg = model.config
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=16, lora_alpha=32, target_modules=list(TARGETS)))
    peft_model.eval()
    batch = max(batches, key=lambda b: sum(s.num_tokens for s in b))
    buffer = ActivationBuffer(cfg.num_hidden_layers, cfg.hidden_size, sum(s.num_tokens for s in batch), dtype=dtype,
                              device=device, offload_to_host=args.offload)
    full: list[float] = []
    lat: list[float] = []
    rng = random.Random(3)
    try:
        for trial in range(args.trials + 1):
            for s in batch:
                buffer.reserve(s)
            step = 2 * trial
            buffer.mark_finetune_only(step)
            if trial == 0:  # an uninterrupted run sets the scale
                dt, _ = timed(device, lambda: capture_forward(peft_model, buffer, step, batch))
                full.append(dt)
                for s in batch:
                    buffer.release(s.sample_id)
                continue
            req = [0.0]

            def arrive() -> None:
                req[0] = time.monotonic()
                buffer.request_abort()

            timer = threading.Timer(rng.uniform(0.1, 0.8) * full[0], arrive)
            timer.start()
            done, aborted = capture_forward(peft_model, buffer, step, batch)
            sync(device)
            t_end = time.monotonic()
            timer.join()
            buffer.clear_abort()
            for s in batch:
                buffer.release(s.sample_id)
            if aborted:
                lat.append(t_end - req[0])
    finally:
        buffer.close()
    per_layer_sample = full[0] / (cfg.num_hidden_layers * len(batch))
    return {
        "trials_aborted": len(lat),
        "ft_only_step_s": full[0],
        "layer_forward_one_sample_s": per_layer_sample,
        "abort_latency_ms": _pcts(lat),
        "within_one_layer_fraction": sum(x <= per_layer_sample for x in lat) / max(1, len(lat)),
    }


def preemption_latency(args: argparse.Namespace, model: torch.nn.Module, state: LoraAdapterState, batches: list,
                       device: torch.device, dtype: torch.dtype, layer_bwd_s: float) -> dict:
    """Grant cleared while a spawned backward trains → how long until it pauses at a layer boundary."""
    from peft import LoraConfig, get_peft_model

    from deltaserve_core.backward_process import BackwardProcess, mps_hint

    cfg = model.config
    capture_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=16, lora_alpha=32, target_modules=list(TARGETS)))
    capture_model.eval()
    batch = max(batches, key=lambda b: sum(s.num_tokens for s in b))
    buffer = ActivationBuffer(cfg.num_hidden_layers, cfg.hidden_size, sum(s.num_tokens for s in batch), dtype=dtype,
                              device=device, offload_to_host=args.offload)
    bp = BackwardProcess(model, state.with_tensors({k: v.clone() for k, v in state.tensors.items()}), buffer,
                         torch_threads=torch.get_num_threads())
    lat: list[float] = []
    steps: list[float] = []
    child_layers: list[tuple[float, ...]] = []
    rng = random.Random(4)
    try:
        t0 = time.monotonic()
        bp.start()
        bp.wait_ready(600)
        startup = time.monotonic() - t0
        for trial in range(args.trials + 2):
            for s in batch:
                buffer.reserve(s)
            capture_forward(capture_model, buffer, trial, batch)
            ids = [s.sample_id for s in batch]
            if trial < 2:  # warm-up and scale
                rep = bp.wait(bp.train_batch(ids), 600)
                steps.append(rep.duration_s)
                child_layers.append(rep.layer_times_s)
                continue
            cmd = bp.train_batch(ids)
            while bp.state != "training":
                time.sleep(0.0005)
            time.sleep(rng.uniform(0.05, 0.7) * steps[-1])
            t_clear = time.monotonic()
            bp.grant.clear()
            finished = None
            while bp.state != "paused":
                got = [r for r in bp.poll() if r.cmd_id == cmd]
                if got:
                    finished = got[0]
                    break
                time.sleep(0.0005)
            if finished is None:
                lat.append(bp.paused_at - t_clear)
                time.sleep(0.01)
            bp.grant.set()
            if finished is None:
                finished = bp.wait(cmd, 600)
            child_layers.append(finished.layer_times_s)
    finally:
        bp.stop()
        bp.close()
        buffer.close()
    # "one layer's compute time" as the child itself ran it (layer_times_s: one layer over the whole batch, pauses
    # excluded). The grant is checked between units (one layer of one packed group of samples, or one group's
    # output head), so the expected bound is one unit; the goal is one layer of the batch.
    mean_layer = statistics.fmean(t for lt in child_layers for t in lt)
    groups = len(pack_groups([s.num_tokens for s in batch], TrainerConfig().pack_tokens))
    units = (len(child_layers[0]) + 1) * groups
    mean_unit = statistics.fmean(sum(lt) / units for lt in child_layers)
    return {
        "child_startup_s": startup,
        "batch_samples": len(batch),
        "packed_groups": groups,
        "backward_step_s": statistics.median(steps),
        "layer_backward_in_process_s": layer_bwd_s,
        "layer_backward_in_child_mean_s": mean_layer,
        "unit_backward_in_child_mean_s": mean_unit,
        "trials_paused": len(lat),
        "preemption_latency_ms": _pcts(lat),
        "within_one_layer_fraction": sum(x <= mean_layer for x in lat) / max(1, len(lat)),
        "mps": mps_hint() if device.type == "cuda" else "n/a (cpu)",
    }


def _pcts(xs: list[float]) -> dict:
    if not xs:
        return {}
    s = sorted(xs)
    q = lambda f: s[min(len(s) - 1, int(f * (len(s) - 1) + 0.5))]  # noqa: E731
    return {"p50": round(q(0.5) * 1e3, 3), "p95": round(q(0.95) * 1e3, 3), "max": round(s[-1] * 1e3, 3),
            "mean": round(statistics.fmean(s) * 1e3, 3)}


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny | smollm2 | llama8b-shape | path to a checkpoint folder")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="float32 (CPU default) | bfloat16 (CUDA default) | float16")
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch-tokens", type=int, default=256)
    ap.add_argument("--trials", type=int, default=15, help="preemption/abort trials")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--offload", action="store_true", help="keep captured activations in host memory (CUDA only)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))

    base_ref, label = load_base(args.model, device, dtype)
    base_ours = copy.deepcopy(base_ref)
    result: dict = {
        "benchmark": "backward_throughput",
        "model": label,
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "dtype": str(dtype).replace("torch.", ""),
        "lora": {"r": 16, "alpha": 32, "targets": list(TARGETS)},
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                        "cpu_count": os.cpu_count(), "commit": source_commit()},
        "goal_ratio": 0.9,
        "activation_offload_to_host": bool(args.offload and device.type == "cuda"),
        "notes": ("llama8b-shape uses random weights (no checkpoint reachable); speed equals real weights"
                  if args.model == "llama8b-shape" else ""),
    }
    tp, state, batches = throughput(args, base_ref, base_ours, device, dtype)
    result["throughput"] = tp
    result["meets_goal"] = tp["ratio_deltaserve_vs_packed"] >= 0.9
    del base_ref
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if not args.skip_latency:
        result["abort"] = abort_latency(args, base_ours, batches, device, dtype)
        result["preemption"] = preemption_latency(args, base_ours, state, batches, device, dtype,
                                                  tp["layer_backward_s_mean"])
    path = args.json or RESULTS / f"backward_throughput-{label}-{device.type}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    t = tp["tokens_per_s"]
    print(f"{label} on {result['device']} ({result['dtype']}): plain {t['plain']:.0f} tok/s, packed PEFT "
          f"{t['packed']:.0f} tok/s, deltaserve {t['deltaserve']:.0f} tok/s (ratio {tp['ratio_deltaserve_vs_plain']:.3f} "
          f"vs plain, {tp['ratio_deltaserve_vs_packed']:.3f} vs packed), per-sample units "
          f"{t['deltaserve_per_sample']:.0f} (ratio {tp['ratio_deltaserve_per_sample_vs_plain']:.3f}), head-on-targets "
          f"{t['deltaserve_fast']:.0f} (ratio {tp['ratio_deltaserve_fast_vs_plain']:.3f}); capture {t['capture']:.0f} "
          f"tok/s; grad rel err {tp['grad_max_rel_err_vs_plain']:.2e}")
    if "preemption" in result:
        pre = result["preemption"]
        print(f"preemption latency ms {pre['preemption_latency_ms']} vs child layer backward (batch) "
              f"{pre['layer_backward_in_child_mean_s'] * 1e3:.3f} ms, unit "
              f"{pre['unit_backward_in_child_mean_s'] * 1e3:.3f} ms; abort latency ms "
              f"{result['abort']['abort_latency_ms']} vs layer forward "
              f"{result['abort']['layer_forward_one_sample_s'] * 1e3:.3f} ms")
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
