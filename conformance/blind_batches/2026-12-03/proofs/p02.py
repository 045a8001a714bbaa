"""p02: a request with ignore_eos=False stops at (and includes) its first EOS (truth: transformers greedy)."""
import torch

from _common import ClientRequest, hf_model, host_module, make, run

m = hf_model(2)
EOS = m.config.eos_token_id
N = 12


@torch.no_grad()
def find_prompt():
    """A prompt whose greedy continuation reaches EOS, as late as the search finds (batched greedy search)."""
    g = torch.Generator().manual_seed(5)
    best = None
    for _ in range(8):
        ids = torch.randint(3, 400, (64, 8), generator=g)
        cur = ids
        for _step in range(N):
            nxt = m(cur).logits[:, -1].argmax(-1, keepdim=True)
            cur = torch.cat([cur, nxt], 1)
        gen = cur[:, 8:]
        for b in range(gen.shape[0]):
            hits = (gen[b] == EOS).nonzero().flatten().tolist()
            if hits and (best is None or hits[0] > best[1]):
                best = (tuple(ids[b].tolist()), hits[0], gen[b, :hits[0] + 1].tolist())
        if best is not None and best[1] >= 2:
            break
    if best is None:  # fall back: any prefix whose next greedy token is EOS
        ids = torch.randint(3, 400, (256, 16), generator=g)
        am = m(ids).logits.argmax(-1)
        b, pos = (am == EOS).nonzero()[0].tolist()
        best = (tuple(ids[b, :pos + 1].tolist()), 0, [EOS])
    return best


P, AT, TRUTH = find_prompt()
print(f"[p02] prompt {P}: greedy reaches EOS ({EOS}) at output index {AT}; truth {TRUTH}")


def check(cls):
    out = make(cls).generate([ClientRequest("r", P, N, ignore_eos=False)])[0]
    got = list(out.token_ids)
    return got == TRUTH, f"ignore_eos=False, max_tokens={N}: got {got}, truth {TRUTH}"


run("p02", check, host_module("02").Host)
