import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: 2-core machines are 5-20x slower with default threads

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    root = Path(os.environ.get("DELTASERVE_CACHE", Path.home() / ".cache" / "deltaserve"))
    root.mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture(scope="session")
def tiny_model(cache_dir: Path) -> Path:
    from deltaserve_core.testing.tiny_model import build_tiny_llama

    return build_tiny_llama(cache_dir / "conformance" / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_adapter(cache_dir: Path, tiny_model: Path) -> Path:
    from deltaserve_core.testing.tiny_model import build_lora_adapter

    return build_lora_adapter(tiny_model, cache_dir / "conformance" / "client-adapter", seed=1)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A 3-layer random Llama and a random LoRA adapter for it (training-path tests)."""
    from deltaserve_core.testing.tiny_model import build_lora_adapter, build_tiny_llama

    root = tmp_path_factory.getbasetemp()
    model_dir = build_tiny_llama(root / "tiny-llama-3l", num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2,
                                 intermediate_size=128)
    adapter_dir = build_lora_adapter(model_dir, root / "tiny-llama-3l-lora")
    return str(model_dir), str(adapter_dir)
