"""p09: ignore_eos implemented by banning EOS. Truth: HF greedy decoding (a prompt whose greedy continuation holds EOS,
found by a deterministic search)."""
from _common import *

EOS = 2  # the test checkpoint's eos_token_id


@torch.no_grad()
def find_prompt(n_tokens: int = 16, length: int = 10):
    m = hf_model(2)
    for batch in range(8):
        prompts = [prompt(length, 9000 + 256 * batch + i) for i in range(256)]
        ids = torch.tensor([list(p) for p in prompts])
        for step in range(n_tokens):
            nxt = m(ids).logits[:, -1].argmax(-1)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
        hits = [(i, ids[i, length:].tolist().index(EOS)) for i in range(len(prompts)) if EOS in ids[i, length:].tolist()]
        if hits:
            i, at = min(hits, key=lambda t: t[1])
            return prompts[i], at
    raise SystemExit("no prompt with EOS in its greedy continuation found")


P, AT = find_prompt()
N = AT + 4
TRUTH = hf_greedy(P, N)
assert EOS in TRUTH, TRUTH


def check(cls):
    h = make(cls)
    got = list(h.generate([ClientRequest("a", P, N)])[0].token_ids)  # ignore_eos=True (the default)
    return got == TRUTH, f"prompt 10, {N} tokens, ignore_eos=True; truth (HF, EOS {EOS} at {TRUTH.index(EOS)}) {TRUTH}; got {got}"


run("p09", check, host_module("09").Host)
