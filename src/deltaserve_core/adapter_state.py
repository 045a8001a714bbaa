"""The trainable LoRA adapter as the core hands it to hosts and checkpoints it.

Weights are keyed the way PEFT names them for a transformers causal LM
(``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight``), so a state can be saved as a PEFT
adapter folder and loaded by PEFT, vLLM or SGLang without renaming.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .lora_spec import LoraConfigSpec

__all__ = ["LoraConfigSpec", "LoraAdapterState", "install_folder", "NonFiniteAdapterError", "all_finite", "check_finite",
           "nonfinite_names", "peft_key", "parse_peft_key", "fresh_lora_state"]

_KEY = re.compile(r"^base_model\.model\.(?P<layers>.+?)\.(?P<idx>\d+)\.(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")


def all_finite(tensors: Iterable[torch.Tensor | None]) -> bool:
    """Whether every element of every tensor is finite (``None`` entries, e.g. absent gradients, are skipped).

    One device sync per device, so the backward can afford it on every optimizer step. Tensors may sit on
    different devices: an optimizer on CUDA parameters keeps its step counters on the CPU."""
    flags: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        if t is not None and t.is_floating_point():
            flags.setdefault(t.device, []).append(torch.isfinite(t).all())
    return all(bool(torch.stack(group).all()) for group in flags.values())


def nonfinite_names(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the tensors holding a NaN or an infinity, sorted (for error messages; slower than
    :func:`all_finite`)."""
    return sorted(k for k, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all()))


class NonFiniteAdapterError(ValueError):
    """An adapter (or optimizer state) holds NaN or infinite values, so it is neither checkpointed nor published."""


def check_finite(tensors: Mapping[str, torch.Tensor], what: str) -> None:
    """Raise :class:`NonFiniteAdapterError` naming the tensors of ``what`` that are not finite."""
    if all_finite(tensors.values()):
        return
    bad = nonfinite_names(tensors)
    raise NonFiniteAdapterError(f"{what} holds non-finite values in {len(bad)} of {len(tensors)} tensors "
                                f"({', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}); refusing to write it")


def write_safetensors(path: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` as a safetensors file and fsync it; a failed write raises ``OSError`` with its errno.

    ``safetensors.torch.save_file`` reports a full disk as a ``SafetensorError`` that callers expecting
    ``OSError`` (a full or broken disk) do not catch; serialising in memory and writing with Python's file I/O
    keeps the kernel's error. Adapter files are small, so the extra copy is cheap."""
    from safetensors.torch import save

    _write_synced(path, save({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                             metadata=dict(metadata or {})))


def _write_synced(path: str | os.PathLike[str], data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def peft_key(layer: int, module: str, ab: str, layers_path: str = "model.layers") -> str:
    """PEFT's state-dict key for the A or B matrix of ``module`` (e.g. ``self_attn.q_proj``) in ``layer``."""
    return f"base_model.model.{layers_path}.{layer}.{module}.lora_{ab}.weight"


def parse_peft_key(key: str) -> tuple[int, str, str]:
    """Inverse of :func:`peft_key`: ``(layer, module, "A"|"B")``."""
    m = _KEY.match(key)
    if m is None:
        raise ValueError(f"not a PEFT LoRA weight key: {key!r}")
    return int(m["idx"]), m["module"], m["ab"]


@dataclass(frozen=True)
class LoraAdapterState:
    """A named, versioned snapshot of LoRA weights (PEFT keys) plus the config that produced them."""

    name: str
    version: int
    config: LoraConfigSpec
    tensors: Mapping[str, torch.Tensor] = field(repr=False)
    base_model_path: str = ""

    def modules(self) -> Sequence[tuple[int, str]]:
        """``(layer, module)`` pairs that carry an adapter, sorted."""
        return sorted({parse_peft_key(k)[:2] for k in self.tensors})

    def pair(self, layer: int, module: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(A [r, in], B [out, r])`` for a module, or ``None`` when the adapter does not touch it."""
        for key in self.tensors:
            li, mod, ab = parse_peft_key(key)
            if li == layer and (mod == module or mod.endswith("." + module)) and ab == "A":
                return self.tensors[key], self.tensors[key[: -len("A.weight")] + "B.weight"]
        return None

    def save_pretrained(self, directory: str | os.PathLike[str], *, if_absent: bool = False) -> Path:
        """Write a PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) atomically.

        ``if_absent``: a complete folder already there is kept as it is, never replaced, so a reader never finds
        it missing (data-parallel ranks on one filesystem publish the same version, bit-identical)."""
        import uuid

        out = Path(directory)
        # a name of this writer's own: two processes may write the same folder at once
        tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            write_safetensors(tmp / "adapter_model.safetensors", self.tensors)
            # synced, like the weights: on disk before the rename makes the folder servable
            _write_synced(tmp / "adapter_config.json",
                          json.dumps(self.config.peft_config_dict(self.base_model_path), indent=2).encode())
        except BaseException:
            # a full disk fails the write mid-file: leave no half-written folder behind (nor its space used)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        keep = (lambda folder: (folder / "adapter_config.json").is_file()) if if_absent else (lambda folder: False)
        return install_folder(tmp, out, keep=keep)

    @classmethod
    def load_pretrained(cls, directory: str | os.PathLike[str], name: str | None = None,
                        version: int = 0) -> "LoraAdapterState":
        """Read a PEFT adapter folder written by PEFT or by :meth:`save_pretrained`."""
        from safetensors.torch import load_file

        d = Path(directory)
        cfg_path = d / "adapter_config.json"
        weights = d / "adapter_model.safetensors"
        if not cfg_path.is_file() or not weights.is_file():
            raise FileNotFoundError(
                f"{d} is not a PEFT LoRA adapter folder: it needs adapter_config.json and adapter_model.safetensors"
            )
        raw = json.loads(cfg_path.read_text())
        targets = raw.get("target_modules") or ()
        if isinstance(targets, str):
            raise ValueError(f"{cfg_path}: target_modules given as a regex ({targets!r}); list the module names")
        config = LoraConfigSpec(r=int(raw["r"]), lora_alpha=float(raw["lora_alpha"]),
                                target_modules=tuple(sorted(targets)), lora_dropout=float(raw.get("lora_dropout", 0.0)))
        tensors = {k.replace(".default", ""): v for k, v in load_file(str(weights)).items()}
        return cls(name=name or d.name, version=version, config=config, tensors=tensors,
                   base_model_path=str(raw.get("base_model_name_or_path") or ""))

    def with_tensors(self, tensors: Mapping[str, torch.Tensor], version: int | None = None) -> "LoraAdapterState":
        return LoraAdapterState(self.name, self.version + 1 if version is None else version, self.config,
                                dict(tensors), self.base_model_path)


def fresh_lora_state(base: torch.nn.Module, config: LoraConfigSpec, *, name: str, seed: int = 0,
                     base_model_path: str = "") -> LoraAdapterState:
    """A PEFT-initialised adapter (A random, B zero) for ``base``, seeded; ``base`` is handed back unwrapped.

    Used for a job's starting weights and for calibration outside a job: PEFT's own initialisation, so a job
    starts exactly where a plain PEFT run with the same seed starts."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    torch.manual_seed(seed)
    peft_model = get_peft_model(base, LoraConfig(r=config.r, lora_alpha=config.lora_alpha,
                                                 target_modules=list(config.target_modules),
                                                 lora_dropout=config.lora_dropout, task_type="CAUSAL_LM"))
    tensors = {k: v.detach().clone() for k, v in get_peft_model_state_dict(peft_model).items()}
    peft_model.unload()  # the backward maps the base modules as plain weights
    return LoraAdapterState(name, 0, config, tensors, base_model_path)


def install_folder(staging: Path, out: Path, *, keep: Callable[[Path], bool] = lambda folder: False) -> Path:
    """Move the finished folder ``staging`` to ``out`` with renames, so a reader never loads half a folder (published
    versions written by several data-parallel ranks at once; the offline test checkpoints built by concurrent test
    workers). When ``out`` already exists and ``keep(out)`` says it is complete and wanted (a
    concurrent writer of the same content landed first), it stays and ``staging`` is discarded; otherwise the old
    folder is moved aside and replaced, never deleted before the new one is in place."""
    try:
        os.rename(staging, out)  # refused while out is a folder with files in it
        return out
    except OSError:
        if keep(out):
            shutil.rmtree(staging, ignore_errors=True)
            return out
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    try:
        os.rename(out, aside / "old")
    except FileNotFoundError:
        pass  # removed meanwhile: nothing to set aside
    try:
        os.rename(staging, out)
    except OSError:  # another writer put its folder there between the two renames
        if not keep(out):
            raise
        shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(aside, ignore_errors=True)
    return out
