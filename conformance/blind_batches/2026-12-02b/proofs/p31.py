"""h31: an adapter the host cannot apply (rank 32 > max_lora_rank 16) is refused by raising."""
import sys
import _common as c


def check(cls):
    h = c.make(cls, max_lora_rank=16)
    try:
        h.set_finetune_adapter(c.lora_state(seed=6, r=32))
    except Exception as e:
        return True, f"refused: {type(e).__name__}"
    return False, "accepted silently"


sys.exit(c.verdict(check, "31"))
