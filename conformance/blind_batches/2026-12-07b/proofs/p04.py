"""p04: model_spec().hidden_size equals config.json's hidden_size on a checkpoint with head_dim 64."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

import json

H = host_module("04").Host
PATH = custom_model("hd64", head_dim=64)


def check(cls):
    cfg = json.loads((PATH / "config.json").read_text())
    spec = make_at(cls, PATH).model_spec()
    return (spec.hidden_size == cfg["hidden_size"],
            f"config hidden_size {cfg['hidden_size']} (heads {cfg['num_attention_heads']} x head_dim "
            f"{cfg['head_dim']}); model_spec().hidden_size {spec.hidden_size}")


run("p04", check, H)
