"""p25: no non-daemon thread of the host alive after shutdown()."""
from _common import *  # noqa: F401,F403

import threading

H = host_module("25").Host


def check(cls):
    before = set(threading.enumerate())
    h = make(cls)
    h.generate([req("a", 8, 1, 2)])
    h.shutdown()
    h.shutdown()
    time.sleep(0.5)
    left = [t.name for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon]
    return not left, f"non-daemon threads started by the host alive 0.5 s after shutdown(): {left or 'none'}"


try:
    run("p25", check, H)
except SystemExit as e:  # exit now: the broken host's thread would hold the interpreter for up to 20 s
    sys.stdout.flush()
    os._exit(e.code or 0)
