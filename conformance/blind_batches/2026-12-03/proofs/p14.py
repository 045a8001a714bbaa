"""p14: model_spec() describes the checkpoint (truth: transformers AutoConfig of model_spec().path)."""
from transformers import AutoConfig

from _common import host_module, make, run


def check(cls):
    spec = make(cls).model_spec()
    cfg = AutoConfig.from_pretrained(spec.path)
    want = (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers)
    got = (spec.vocab_size, spec.hidden_size, spec.num_layers)
    return got == want, f"(vocab, hidden, layers) reported {got}, checkpoint {want}"


run("p14", check, host_module("14").Host)
