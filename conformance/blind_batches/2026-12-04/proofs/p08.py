"""p08: shutdown() is idempotent."""
from _common import *  # noqa: F403

H = host_module("08").Host


def check(cls):
    h = make(cls)
    install(h)
    h.generate([ClientRequest("a", prompt(6, 1), 3)])
    h.shutdown()
    try:
        h.shutdown()
    except Exception as e:  # noqa: BLE001
        return False, f"second shutdown() raised {type(e).__name__}: {e}"
    return True, f"shutdown() twice, no error; has_unfinished()={h.has_unfinished()}"


run("p08", check, H)
