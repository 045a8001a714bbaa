"""p14: ModelSpec.vocab_size must be the checkpoint config's vocab_size."""
from _common import *  # noqa: F403

from transformers import AutoConfig, AutoTokenizer  # noqa: E402

from deltaserve_core.testing.tiny_model import build_tiny_llama  # noqa: E402

Host = host_module("14").Host
PATH = build_tiny_llama(CACHE / "tiny2_v512", num_layers=2, model_vocab_size=512)
CFG = AutoConfig.from_pretrained(str(PATH)).vocab_size
TOK = len(AutoTokenizer.from_pretrained(str(PATH)))


def check(cls):
    spec = make_at(cls, PATH).model_spec()
    return spec.vocab_size == CFG, f"config vocab_size {CFG}, tokenizer {TOK} tokens; model_spec().vocab_size {spec.vocab_size}"


run("p14", check, Host)
