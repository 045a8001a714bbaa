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
