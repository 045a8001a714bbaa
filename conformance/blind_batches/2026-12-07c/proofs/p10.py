"""p10: only the first id of an eos_token_id list stops. Truth: HF greedy decoding cut at the first EOS of the list."""
from _common import *

P = prompt(12, 101)
BASE = custom_model("eosbase")
FREE = hf_greedy_at(BASE, P, 12)
# a token greedy decoding emits (not at the first position, not 2) becomes the checkpoint's second EOS id
T = next(t for j, t in enumerate(FREE) if j >= 2 and t != 2 and t not in FREE[:j])
PATH = custom_model("eoslist", eos_token_id=[2, T])
TRUTH = hf_greedy_at(PATH, P, 12)
assert TRUTH == FREE, "same weights"
CUT = TRUTH[: TRUTH.index(T) + 1] if 2 not in TRUTH[: TRUTH.index(T)] else TRUTH[: TRUTH.index(2) + 1]


def check(cls):
    h = make_at(cls, PATH)
    got = list(h.generate([ClientRequest("a", P, 12, ignore_eos=False)])[0].token_ids)
    return got == CUT, f"eos_token_id [2, {T}], ignore_eos=False, max_tokens 12: truth (HF, cut at first EOS) {CUT}; got {got}"


run("p10", check, host_module("10").Host)
