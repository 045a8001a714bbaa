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
            assert isinstance(arg, ast.Attribute) and arg.attr == "name"
            wrapped.append(arg.value.slice.value)  # PATCHES[i].name
    assert sorted(wrapped) == list(range(len(PATCHES)))
    for node in ast.walk(tree):  # the attribute wrapped is the method the record names
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_wrap":
            attr = node.args[1].value
            assert PATCHES[node.args[2].value.slice.value].name.endswith("." + attr)
    doc = (ROOT / "docs" / "slora-adapter.md").read_text()
    in_doc = set(re.findall(r"`(slora\.[\w.]+)`", doc))
    assert {p.name for p in PATCHES} <= in_doc
    assert all(p.scope in ("instance", "class") and p.why and p.breaks_if for p in PATCHES)


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
    assert res["slora_commit"] == "c1ddf488781ea7f551cd0bb07bfd097124c93411"
    assert {"torch", "transformers", "peft", "triton", "cuda"} <= set(res["versions"]) and res["date"]
    assert res["conformance"]["failed"] == 0 and res["conformance"]["passed"] >= 15
    assert shutil.which("bash") is None or (ROOT / "benchmarks" / "gpu" / "slora_h200.sh").is_file()
