"""p25: model_spec().path is a local checkpoint folder transformers loads, holding the served model (truth: the
HostConfig's model folder; the proof runs from a directory other than its parent)."""
import os
from pathlib import Path

from transformers import AutoConfig

from _common import host_module, make, model_dir, run

os.chdir("/")


def check(cls):
    spec = make(cls).model_spec()
    p = Path(spec.path)
    ok = p.is_dir() and p.resolve() == model_dir().resolve()
    if ok:
        ok = AutoConfig.from_pretrained(spec.path).num_hidden_layers == spec.num_layers
    return ok, f"path {spec.path!r}: folder {p.is_dir()}, checkpoint {str(model_dir())!r}"


run("p25", check, host_module("25").Host)
