"""deltaserve_slora without S-LoRA (CI): locating a checkout, version checks, the PEFT <-> KV-pool layout, the GQA
expansion, and the patch record against the wraps the installer applies. Tests that need S-LoRA and CUDA are in
tests/test_slora_gpu.py (skipped here; run benchmarks/gpu/slora_h200.sh on a CUDA machine)."""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_slora import layout
from deltaserve_slora.locate import (
    ATTACH_FILES,
    ENV_VAR,
    SloraNotFoundError,
    activate,
    inspect_checkout,
    locate_slora,
)
from deltaserve_slora.patches import PATCHES

ROOT = Path(__file__).resolve().parents[1]


def _fake_checkout(tmp: Path, *, kernels: bool = True, edit: str | None = None) -> Path:
    """A folder laid out like an S-LoRA checkout whose attach files carry the tested hashes' *names* but our bytes."""
    for f in ATTACH_FILES:
        p = tmp / f
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("# not S-LoRA\n")
    if kernels:
        (tmp / "slora" / "_kernels.cpython-312-x86_64-linux-gnu.so").write_bytes(b"")
    return tmp


def test_not_found_names_every_place_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(SloraNotFoundError) as exc:
        locate_slora()
    msg = str(exc.value)
    assert ENV_VAR in msg and "--slora-path" in msg and "github.com/S-LoRA/S-LoRA" in msg and "build_ext" in msg


def test_path_that_does_not_exist_or_is_not_slora(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SloraNotFoundError, match="does not exist"):
        locate_slora(tmp_path / "nope")
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    with pytest.raises(SloraNotFoundError, match="not an S-LoRA checkout"):
        locate_slora()


def test_untested_or_unbuilt_checkout_is_refused(tmp_path: Path) -> None:
    co = inspect_checkout(_fake_checkout(tmp_path / "a", kernels=False))
    with pytest.raises(SloraNotFoundError, match="no built CUDA extension"):
        activate(co)
    co = inspect_checkout(_fake_checkout(tmp_path / "b"))
    assert co.kernels is not None and not co.tested
    with pytest.raises(SloraNotFoundError, match="not a tested S-LoRA.*attach-point files differ"):
        activate(co)
    (tmp_path / "b" / "COMMIT").write_text("0" * 40)
    with pytest.raises(SloraNotFoundError, match="c1ddf48"):
        activate(inspect_checkout(tmp_path / "b"))


def test_tested_commit_file_is_accepted(tmp_path: Path) -> None:
    root = _fake_checkout(tmp_path)
    (root / "COMMIT").write_text("c1ddf488781ea7f551cd0bb07bfd097124c93411\n")
    co = inspect_checkout(root)
    assert co.tested and co.commit.startswith("c1ddf48")


def _peft_adapter(model_dir: Path, out: Path) -> Path:
    from deltaserve_core.testing.tiny_model import build_lora_adapter

    return build_lora_adapter(model_dir, out, seed=5, r=8)


def _hf_config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def test_pool_rows_round_trip_a_real_peft_adapter_and_apply_like_the_kernels(tiny_model: Path, tmp_path: Path) -> None:
    """pool_rows -> peft_from_pool_rows gives back the (MHA-expanded) PEFT tensors, and the kernels' addressing
    (bgmv shrink: row j = A[j]; expand: W[(o*r+k)//out][(o*r+k)%out] = B[o,k]) applied to the rows gives PEFT's
    delta x @ A^T @ B^T."""
    cfg = _hf_config(tiny_model)
    state = LoraAdapterState.load_pretrained(_peft_adapter(tiny_model, tmp_path / "ad"))
    r, hidden = state.config.r, cfg["hidden_size"]
    rows = layout.pool_rows(state, cfg, dtype=torch.float32)
    assert rows[0].shape == (2, 4 * r, cfg["num_attention_heads"], hidden // cfg["num_attention_heads"])
    back = layout.peft_from_pool_rows(rows, r, cfg)
    x = torch.randn(3, hidden)
    for li in range(cfg["num_hidden_layers"]):
        for qi, m in enumerate(layout.SLORA_MODULES):
            a, b = state.pair(li, m)
            a, b = layout.expand_lora_pair(m, a, b, cfg)
            key = f"base_model.model.model.layers.{li}.self_attn.{m}"
            assert torch.equal(back[f"{key}.lora_A.weight"], a) and torch.equal(back[f"{key}.lora_B.weight"], b)
            w_a = rows[li][0].reshape(4 * r, hidden)[qi * r:(qi + 1) * r]
            w_b = rows[li][1].reshape(-1)[qi * r * hidden:(qi + 1) * r * hidden]
            shrink = x @ w_a.T
            expand = torch.stack([torch.stack([sum(w_b[o * r + k] * shrink[n, k] for k in range(r))
                                               for o in range(hidden)]) for n in range(x.shape[0])])
            torch.testing.assert_close(expand, x @ a.T @ b.T, rtol=1e-5, atol=1e-5)


def test_gqa_expansion_is_exact_through_transformers(tiny_model: Path, tmp_path: Path) -> None:
    """The MHA copy S-LoRA serves computes the same logits as the GQA original, with the adapter applied too."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = _hf_config(tiny_model)
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]  # the conformance model is GQA
    mha_dir, mha_cfg = layout.write_mha_checkpoint(tiny_model, tmp_path / "mha")
    assert mha_cfg["num_key_value_heads"] == mha_cfg["num_attention_heads"] and mha_cfg["rope_theta"] == 10000.0
    # the copy is a whole serving folder: a fine-tuning job on it formats its dataset with the same chat template
    from transformers import AutoTokenizer
    assert AutoTokenizer.from_pretrained(mha_dir).chat_template == AutoTokenizer.from_pretrained(tiny_model).chat_template
    assert AutoTokenizer.from_pretrained(mha_dir).chat_template
    ids = torch.tensor([[5, 17, 99, 3, 250, 41]])
    state = LoraAdapterState.load_pretrained(_peft_adapter(tiny_model, tmp_path / "ad"))
    layout.write_slora_adapter(state, cfg, tmp_path / "ad_mha")
    with torch.no_grad():
        ref = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32),
                                        tmp_path / "ad").eval()
        got = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(mha_dir, dtype=torch.float32),
                                        tmp_path / "ad_mha").eval()
        # The MHA copy is fp16 on disk: compare against the original rounded the same way.
        for p_ref in ref.parameters():
            p_ref.copy_(p_ref.half().float())
        for p in got.parameters():
            p.copy_(p.half().float())
        torch.testing.assert_close(got(input_ids=ids).logits, ref(input_ids=ids).logits, rtol=1e-4, atol=1e-4)


def test_adapters_slora_cannot_serve_are_refused(tiny_model: Path, tmp_path: Path) -> None:
    from deltaserve_core.testing.tiny_model import build_lora_adapter

    cfg = _hf_config(tiny_model)
    mlp = LoraAdapterState.load_pretrained(build_lora_adapter(tiny_model, tmp_path / "mlp",
                                                              target_modules=("q_proj", "gate_proj")))
    with pytest.raises(layout.UnsupportedAdapterError, match="gate_proj"):
        layout.pool_rows(mlp, cfg)
    q_only = LoraAdapterState.load_pretrained(build_lora_adapter(tiny_model, tmp_path / "q", target_modules=("q_proj",)))
    with pytest.raises(layout.UnsupportedAdapterError, match="no LoRA on k_proj"):
        layout.pool_rows(q_only, cfg)


def test_adapter_folder_names_survive_slora_name_stripping() -> None:
    for name in ("client", "bot@v12", "x-3", "a/b"):
        d = layout.slora_dir_name(name, 7)
        assert re.sub(r"-(\d+)$", "", d) == d  # S-LoRA's get_lora_config strips a trailing -<digits>
        assert "/" not in d


def test_patch_record_matches_the_installer_and_the_doc() -> None:
    """Every _wrap call in patches.install names a record entry, each entry is wrapped exactly once, and the doc's
    patch table lists the same methods. (On the GPU, test_slora_gpu checks the installer applied all of them.)"""
    tree = ast.parse((ROOT / "src" / "deltaserve_slora" / "patches.py").read_text())
    wrapped = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_wrap":
            arg = node.args[2]
            assert isinstance(arg, ast.Attribute) and arg.attr == "target"
            wrapped.append(arg.value.slice.value)  # PATCHES[i].target
    assert sorted(wrapped) == list(range(len(PATCHES)))
    for node in ast.walk(tree):  # the attribute wrapped is the method the record names
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_wrap":
            attr = node.args[1].value
            assert PATCHES[node.args[2].value.slice.value].target.endswith("." + attr)
    doc = (ROOT / "docs" / "slora-adapter.md").read_text()
    in_doc = set(re.findall(r"`(slora\.[\w.]+)`", doc))
    assert {p.target for p in PATCHES} <= in_doc
    assert all(p.how in ("instance", "class", "module") and p.why and p.breaks_if for p in PATCHES)
    assert all(p.applies in ("router", "operator") for p in PATCHES)


def test_registered_and_importable_without_slora() -> None:
    from deltaserve_core.registry import available_hosts, get_host_spec

    assert "slora" in available_hosts()
    spec = get_host_spec("slora")
    assert spec.factory == "deltaserve_slora.host:SloraHost" and spec.version_problem() is None
    import sys

    import deltaserve_slora.host  # noqa: F401  (imports no S-LoRA module at import time)

    assert "slora" not in sys.modules


def test_host_refuses_cpu_and_non_fp16_before_touching_slora(tiny_model: Path) -> None:
    from deltaserve_core.driver import HostConfig
    from deltaserve_slora.host import SloraHost

    with pytest.raises(ValueError, match="fp16 on CUDA only"):
        SloraHost(HostConfig(model=str(tiny_model)))
    with pytest.raises(ValueError, match="fp16 on CUDA only"):
        SloraHost(HostConfig(model=str(tiny_model), device="cuda", dtype="bfloat16"))


def test_gpu_result_is_committed_with_commit_and_versions() -> None:
    res = json.loads((ROOT / "benchmarks" / "results" / "slora_h200.json").read_text())
    # SLORA_COMMIT names it when the carried source has no git metadata (then often abbreviated)
    assert len(res["slora_commit"]) >= 7 and "c1ddf488781ea7f551cd0bb07bfd097124c93411".startswith(res["slora_commit"])
    assert {"torch", "transformers", "peft", "triton", "cuda"} <= set(res["versions"]) and res["date"] and res["commit"]
    assert res["conformance"]["failed"] == 0 and res["conformance"]["passed"] >= 15
    assert shutil.which("bash") is None or (ROOT / "benchmarks" / "gpu" / "slora_h200.sh").is_file()


# ------------------------------------------------------------------------------------------ operator path

def _job(tmp: Path, extra: str = "") -> Path:
    (tmp / "data.json").write_text(json.dumps([{"instruction": "a", "input": "", "output": "b"}]))
    (tmp / "job.yaml").write_text("dataset: data.json\nadapter_name: served\nlora: {r: 8, alpha: 16}\n" + extra)
    return tmp / "job.yaml"


def _mha_config(tmp: Path, kv_heads: int = 4) -> Path:
    d = tmp / "tiny-llama"  # S-LoRA's API server needs 'llama' in the folder name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "num_attention_heads": 4,
                                               "num_key_value_heads": kv_heads, "hidden_size": 128,
                                               "num_hidden_layers": 2, "vocab_size": 512}))
    return d


def test_launch_arguments_split_at_double_dash() -> None:
    from deltaserve_slora.launch import parse_args

    opts, rest = parse_args(["--job", "j.yaml", "--slora-path", "/s", "--", "--model_dir", "m", "--port", "9"])
    assert (opts.job, opts.slora_path, rest) == ("j.yaml", "/s", ["--model_dir", "m", "--port", "9"])
    with pytest.raises(SystemExit):
        parse_args(["--job", "j.yaml", "--model_dir", "m"])  # S-LoRA's arguments must follow --
    with pytest.raises(SystemExit):
        parse_args(["--", "--model_dir", "m"])  # --job is required


def test_launch_refuses_slora_options_it_cannot_run_with(tmp_path: Path) -> None:
    from deltaserve_slora.launch import check_slora_args

    model = _mha_config(tmp_path)
    lora = ["--lora-dirs", "/adapters/a"]
    argv, resolved = check_slora_args(["--model_dir", str(model), "--port", "8000", *lora])
    assert argv == ["--model_dir", str(model), "--port", "8000", *lora, "--swap"] and resolved == model.resolve()
    assert check_slora_args(["--model_dir", str(model), "--swap", *lora])[0].count("--swap") == 1
    with pytest.raises(ValueError, match="at least one --lora-dirs"):
        check_slora_args(["--model_dir", str(model)])
    for bad, match in ((["--tp", "2"], "--tp 1"), (["--scheduler", "pets"], "--scheduler slora"),
                       (["--batch-num-adapters", "2"], "batch-num-adapters"), (["--enable-abort"], "drop --enable-abort"),
                       (["--bmm"], "drop --bmm"), (["--no-lora"], "drop --no-lora"), (["--enable-ab"], "in full"),
                       (["--prefetch"], "drop --prefetch")):
        with pytest.raises(ValueError, match=match):
            check_slora_args(["--model_dir", str(model), *lora, *bad])
    with pytest.raises(ValueError, match="needs --model_dir"):
        check_slora_args(["--port", "8000"])
    named = tmp_path / "tiny-model"
    named.mkdir()
    (named / "config.json").write_text((model / "config.json").read_text())
    with pytest.raises(ValueError, match="contains 'llama'"):
        check_slora_args(["--model_dir", str(named), *lora])
    (tmp_path / "gqa").mkdir()
    with pytest.raises(ValueError, match="grouped-query.*write_mha_checkpoint"):
        check_slora_args(["--model_dir", str(_mha_config(tmp_path / "gqa", kv_heads=2)), *lora])


def test_launch_refuses_a_bad_job_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import sys

    from deltaserve_slora.launch import main

    job = _job(tmp_path, "lora: {r: 0}\n")
    assert main(["--job", str(job), "--", "--model_dir", str(_mha_config(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "lora" in err and "deltaserve_slora.launch:" in err
    assert "slora" not in sys.modules  # refused before S-LoRA was looked for or imported


def test_launch_without_checkout_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture) -> None:
    from deltaserve_slora.launch import main

    monkeypatch.delenv(ENV_VAR, raising=False)
    model = str(_mha_config(tmp_path))
    assert main(["--job", str(_job(tmp_path)), "--", "--model_dir", model, "--lora-dirs", "/a"]) == 2
    err = capsys.readouterr().err
    assert "--slora-path" in err and ENV_VAR in err and "build_ext" in err and "github.com/S-LoRA/S-LoRA" in err


def test_launch_without_calibration_names_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    """With a (tested, built) checkout but no stored profile, start-up stops with the calibrate command for this
    model, before S-LoRA is imported."""
    import sys

    from deltaserve_slora.launch import main

    root = _fake_checkout(tmp_path / "slora")
    (root / "COMMIT").write_text("c1ddf488781ea7f551cd0bb07bfd097124c93411\n")
    monkeypatch.setattr(sys, "path", list(sys.path))  # activate() puts the checkout on sys.path
    monkeypatch.setenv("DELTASERVE_PROFILE_DIR", str(tmp_path / "profiles"))
    model = _mha_config(tmp_path)
    assert main(["--job", str(_job(tmp_path)), "--slora-path", str(root), "--", "--model_dir", str(model),
                 "--lora-dirs", "/a"]) == 2
    err = capsys.readouterr().err
    assert f"deltaserve calibrate --host slora --model {model.resolve()} --device cuda --dtype float16" in err
    assert "slora" not in sys.modules


def test_launcher_profile_key_is_the_router_hooks_key(tmp_path: Path) -> None:
    """The launcher checks the profile before S-LoRA starts; the router process loads it by the key of its
    SloraHooks: both must be the key `deltaserve calibrate --host slora` stores (SloraHost's)."""
    from deltaserve_core.calibration import ProfileKey
    from deltaserve_slora.host import SloraHooks
    from deltaserve_slora.launch import profile_key

    root = _fake_checkout(tmp_path / "slora")
    (root / "COMMIT").write_text("c1ddf488781ea7f551cd0bb07bfd097124c93411\n")
    checkout = inspect_checkout(root)
    model = str(_mha_config(tmp_path).resolve())
    hooks = SloraHooks()
    hooks._init_hooks(checkout=checkout, model_path=model, served_dir=Path(model), work_dir=tmp_path / "w",
                      device="cuda", max_lora_rank=8, max_batch_tokens=1024)
    assert ProfileKey.for_host(hooks) == profile_key(checkout, model)
    assert profile_key(checkout, model).engine_version == "c1ddf488781e"


def test_router_entry_pickles_by_reference_for_spawn(tmp_path: Path) -> None:
    """S-LoRA's server spawns its router process: the entry the launcher installs must unpickle there by name."""
    import functools
    import pickle

    from deltaserve_slora.launch import LaunchSettings, router_process

    from deltaserve_slora.launch import detokenization_process

    entry = functools.partial(router_process, LaunchSettings(job="/j.yaml", slora_root="/s", model_path="/m"))
    back = pickle.loads(pickle.dumps(entry))
    assert back.func is router_process and back.args == entry.args
    assert pickle.loads(pickle.dumps(detokenization_process)) is detokenization_process


def test_operator_wraps_are_recorded_and_restored() -> None:
    """The launcher's wrap of api_server.start_router_process is in the record and is undone by value (a module
    attribute cannot fall back to a class method)."""
    import types

    from deltaserve_slora.patches import (
        ROUTER_PATCHES,
        install_server_entry,
        uninstall_operator,
    )

    operator = [p for p in PATCHES if p.applies == "operator"]
    assert [p.target for p in operator] == ["slora.server.api_server.start_router_process",
                                          "slora.server.router.manager.RouterManager.wait_to_model_ready",
                                          "slora.server.router.manager.RouterManager.loop_for_fwd",
                                          "slora.server.router.manager.RouterManager.add_req",
                                          "slora.server.api_server.start_detokenization_process"]
    assert len(ROUTER_PATCHES) + len(operator) == len(PATCHES)

    def stock(*args: object) -> None: ...

    def stock_detok(*args: object) -> None: ...

    def entry(*args: object) -> None: ...

    def detok(*args: object) -> None: ...

    api_server = types.ModuleType("api_server")
    api_server.start_router_process = stock  # type: ignore[attr-defined]
    api_server.start_detokenization_process = stock_detok  # type: ignore[attr-defined]
    assert install_server_entry(api_server, entry, detok) == [operator[0].target, operator[4].target]
    assert api_server.start_router_process is entry and api_server.start_detokenization_process is detok
    uninstall_operator()
    assert api_server.start_router_process is stock and api_server.start_detokenization_process is stock_detok
    doc = (ROOT / "docs" / "slora-adapter.md").read_text()
    assert "python -m deltaserve_slora.launch --job" in doc


def test_offload_reserve_keeps_only_loaded_adapters() -> None:
    """S-LoRA's InferAdapter.offload_adapters crashes (IndexError) for a non-empty reserve that keeps no loaded
    adapter, e.g. {None} once only base rows run: the wrap hands it only the loaded adapters of the reserve."""
    from deltaserve_slora.patches import loaded_reserve

    assert loaded_reserve(["ft", "zero"], {None}) == []  # the crash case: now S-LoRA's offload-everything path
    assert loaded_reserve(["ft", "zero", "client"], [None, "client"]) == ["client"]
    assert loaded_reserve(["client"], [None, "client"]) == ["client"]  # keeps all: S-LoRA's no-op path
    assert loaded_reserve(["a", "b"], ["b", "gone", "b", "a"]) == ["b", "a"]
    assert loaded_reserve([], None) == []


def test_recover_leaves_router_and_model_consistent() -> None:
    """After a step raised part-way (router batch filtered, model batch not, pool index half-rewritten), recover()
    drops the running batch on both sides, frees its model batch, resets the pool and clears the step plan."""
    import types

    from deltaserve_slora.patches import FINETUNE_REQUEST_PREFIX, Channel, StepPlan, recover

    freed = []

    class InferBatch:
        def __init__(self, ids):
            self.requests = [{"request_id": i} for i in ids]

        def free_self(self):
            freed.append([r["request_id"] for r in self.requests])

    class Shape:
        def __init__(self, n):
            self.shape = (n,)

    class Pool:
        def __init__(self, dirs, starts):
            self.adapter_dirs, self.idx_map = list(dirs), {d: i for i, d in enumerate(dirs)}
            self.a_start, self.a_loc, self.a_len, self.a_scaling = Shape(starts), Shape(0), Shape(starts), Shape(0)
            self.prefetch_tag, self.cur_tag, self.mem_manager, self.prefetch_stream = {}, 0, "mm", None
            self.offloaded = []

        @classmethod
        def init(cls, mem_manager, prefetch_stream):
            return cls([], 0)

        def offload_adapters(self, reserve):
            self.offloaded.append(list(reserve))

    router = types.SimpleNamespace(running_batch=types.SimpleNamespace(reqs=[types.SimpleNamespace(request_id="r0")]),
                                   has_wait_tokens=7)
    pool = Pool([], 2)  # S-LoRA's failed offload: dirs/idx_map cleared, a_start still two entries
    ft_batch = InferBatch([FINETUNE_REQUEST_PREFIX + "1-2"])
    server = types.SimpleNamespace(cache={"b": InferBatch(["r0", "r1"]), "c": ft_batch}, infer_adapter=pool)
    ch = Channel()
    ch.plans["b"] = StepPlan(step_id=3)
    assert recover(router, server, ch) == ["r0", "r1"]
    assert router.running_batch is None and router.has_wait_tokens == 0 and not server.cache and not ch.plans
    assert sorted(freed) == [[FINETUNE_REQUEST_PREFIX + "1-2"], ["r0", "r1"]]
    assert server.infer_adapter is pool and pool.a_start.shape == (0,) and pool.offloaded == []  # rebuilt in place
    consistent = Pool(["ft", "zero"], 2)
    server.infer_adapter = consistent
    recover(router, server, ch)
    assert consistent.offloaded == [[]]  # a consistent pool is offloaded through S-LoRA's own path


def _fake_slora(monkeypatch: pytest.MonkeyPatch, layers: int, vocab: int):
    """Just enough of S-LoRA for patches.install on CPU: the router's prefill path (init the model batch, the
    ModelRpcServer's forward, its sampling of the logits it gets back) and the LoraUnorderedBatchInfer layer loop,
    with the method names and signatures of c1ddf48. Returns (router, server, what ran)."""
    import asyncio  # noqa: F401  (the router's methods are coroutines, as S-LoRA's)
    import sys
    import types

    ran: list[object] = []
    base_model = types.SimpleNamespace(layers_num=layers, pre_post_weight=types.SimpleNamespace(
        lm_head_weight_=torch.zeros(vocab, 8)))

    class LoraUnorderedBatchInfer:
        def __init__(self, base_model, adapters, infer_adapter=None):  # noqa: ANN001
            self.base_model = base_model

        def _context_forward(self, input_ids, infer_state, no_lora_compute=False):  # noqa: ANN001
            embs = torch.zeros(len(input_ids), 8)
            for i in range(self.base_model.layers_num):
                embs = self._lora_context_forward(i, embs, infer_state, no_lora_compute)
            ran.append("head")  # final norm + LM head
            return torch.full((infer_state.batch_size, vocab), 1.0)

        def _lora_context_forward(self, layer_id, input_embs, infer_state, no_lora_compute=False):  # noqa: ANN001
            ran.append(layer_id)
            input_embs += 1.0
            return input_embs

    class Batch:
        def __init__(self, batch_id, reqs):  # noqa: ANN001
            self.batch_id, self.reqs = batch_id, reqs

    class Req:
        def __init__(self, adapter_dir, request_id, prompt_ids, sample_params):  # noqa: ANN001
            self.adapter_dir, self.request_id, self.input_len = adapter_dir, request_id, len(prompt_ids)
            self.prompt_ids, self.aborted = prompt_ids, False

    class SamplingParams:
        def __init__(self, **kwargs):  # noqa: ANN003
            self.__dict__.update(kwargs)

    class InferBatch:
        def __init__(self, reqs):  # noqa: ANN001
            self.requests = [{"request_id": r.request_id} for r in reqs]
            self.input_lengths = [r.input_len for r in reqs]
            self.adapter_dirs = [r.adapter_dir for r in reqs]
            self.input_ids = torch.zeros(sum(self.input_lengths), dtype=torch.long)

    class Server:
        def __init__(self):
            self.cache: dict = {}
            self.model = types.SimpleNamespace(mem_manager=types.SimpleNamespace(can_use_mem_size=10_000))
            self.infer_adapter = types.SimpleNamespace(adapter_dirs=[], offload_adapters=lambda *a, **k: None)

        def forward(self, batch_id, is_prefill):  # noqa: ANN001
            batch = self.cache.pop(batch_id)  # as S-LoRA: the batch is out of the cache during the forward
            engine = LoraUnorderedBatchInfer(base_model, batch.adapter_dirs)
            state = types.SimpleNamespace(batch_size=len(batch.requests))
            logits = engine._context_forward(batch.input_ids, state)
            ran.append(("sampled", tuple(logits.shape), float(logits.abs().sum())))
            self.cache[batch_id] = batch
            return {r["request_id"]: (int(logits[i].argmax()), {}) for i, r in enumerate(batch.requests)}

    server = Server()

    class Queue:
        def __init__(self):
            self.waiting_req_list: list = []

        def generate_new_batch(self, current_batch, lora_ranks):  # noqa: ANN001
            if not self.waiting_req_list:
                return None
            reqs, self.waiting_req_list = self.waiting_req_list, []
            return Batch(f"b{len(ran)}", reqs)

    class Router:
        def __init__(self):
            self.req_queue = Queue()
            self.input_params = types.SimpleNamespace(batch_max_tokens=4096, running_max_req_size=64)
            self.lora_ranks = {"ft": 8, "client": 8}
            self.sent: list = []

        async def _prefill_batch(self, batch, minibatch=True):  # noqa: ANN001
            server.cache[batch.batch_id] = InferBatch(batch.reqs)
            out = server.forward(batch.batch_id, True)
            self._send_to_detokenization_proc(batch, out)
            server.cache.pop(batch.batch_id)  # every row finished (1 token): S-LoRA removes the batch

        async def _decode_batch(self, batch):  # noqa: ANN001
            raise AssertionError("no decode in these steps")

        def _send_to_detokenization_proc(self, batch, req_ans):  # noqa: ANN001
            self.sent.append(dict(req_ans))

    infer_mod = types.ModuleType("slora.models.peft.lora_unordered_batch_infer")
    infer_mod.LoraUnorderedBatchInfer = LoraUnorderedBatchInfer  # type: ignore[attr-defined]
    io_mod = types.ModuleType("slora.server.io_struct")
    io_mod.Batch, io_mod.Req = Batch, Req  # type: ignore[attr-defined]
    sp_mod = types.ModuleType("slora.server.sampling_params")
    sp_mod.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    for name in ("slora", "slora.models", "slora.models.peft", "slora.server"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    for mod in (infer_mod, io_mod, sp_mod):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    router = Router()
    router.Req = Req  # type: ignore[attr-defined]
    return router, server, ran


def test_abort_stops_a_finetune_only_step_at_the_layer_boundary_and_no_other() -> None:
    """supports_abort on S-LoRA, through patches.install over a CPU stand-in for S-LoRA's prefill path: in a
    fine-tuning-only step should_abort is polled before every layer; when it says True the layer loop stops there
    (no later layer, no LM head), the sink is told every sample aborted, S-LoRA's sampler gets zero logits of its
    usual shape, the record lists the samples aborted; the next step runs whole, and a step with client rows is
    never aborted (nor polled)."""
    import asyncio

    from deltaserve_conformance.harness import Recorder
    from deltaserve_core.types import FineTuneSample
    from deltaserve_slora import patches

    mp = pytest.MonkeyPatch()
    router, server, ran = _fake_slora(mp, layers=4, vocab=11)
    ch = patches.Channel()
    ch.reserved_dir = "ft"
    try:
        assert patches.install(router, server, ch) == [p.target for p in patches.ROUTER_PATCHES]

        def sample(i: int, n: int) -> FineTuneSample:
            return FineTuneSample(i, tuple(range(1, n + 1)), (True,) * n)

        def step(rec: Recorder, samples: list[FineTuneSample], client: int = 0) -> int:
            ch.interceptor, ch.activation_sink, ch.step_sink = rec, rec, rec
            rec.inject = lambda batch: samples if not rec.injected else ()
            router.req_queue.waiting_req_list = [router.Req("client", f"c{i}", [5, 6, 7], None) for i in range(client)]
            batch = router.req_queue.generate_new_batch(None, router.lora_ranks)
            ran.clear()
            asyncio.run(router._prefill_batch(batch))
            (step_id,) = rec.injected
            return step_id

        # aborted at the boundary before layer 2 (the third poll answers True)
        rec = Recorder(abort_after_layer=2)
        sid = step(rec, [sample(1, 5), sample(2, 3)])
        assert ran == [0, 1, ("sampled", (2, 11), 0.0)]  # layers 0 and 1 ran; no layer 2, no LM head; zeros
        assert [p for s, p in rec.abort_polls if s == sid] == [0, 1, 2]
        assert sorted({layer for s, layer, _, _ in rec.captures if s == sid}) == [0, 1]
        assert rec.ended == [(sid, (), (1, 2))]
        (record,) = rec.records
        assert record.step_id == sid and sorted(record.aborted_sample_ids) == [1, 2]
        assert not record.finetune_sample_ids and not record.finetune_lengths
        assert router.sent[-1] == {}  # the rows' tokens never reach the output stage
        assert patches._CAPTURE == patches._IDLE_CAPTURE and patches._ACTIVE is None

        # at layer 0: nothing runs
        rec = Recorder(abort_after_layer=0)
        sid = step(rec, [sample(3, 4)])
        assert ran == [("sampled", (1, 11), 0.0)] and not rec.captures and rec.ended == [(sid, (), (3,))]

        # the next fine-tuning-only step, not aborted: every layer, completed
        rec = Recorder()
        sid = step(rec, [sample(4, 6)])
        assert ran[:5] == [0, 1, 2, 3, "head"] and len(rec.abort_polls) == 4
        assert rec.ended == [(sid, (4,), ())]
        (record,) = rec.records
        assert record.finetune_sample_ids == (4,) and record.finetune_lengths == (6,) and not record.aborted_sample_ids

        # rows sharing a step with client rows complete whatever should_abort would say
        rec = Recorder(abort_after_layer=0)
        sid = step(rec, [sample(5, 2)], client=2)
        assert ran[:5] == [0, 1, 2, 3, "head"] and not rec.abort_polls and rec.ended == [(sid, (5,), ())]
        (record,) = rec.records
        assert record.finetune_sample_ids == (5,) and not record.aborted_sample_ids and record.prefill_lengths == (3, 3)
        assert set(router.sent[-1]) == {"c0", "c1"}
    finally:
        patches.uninstall()
        mp.undo()
