"""Stock S-LoRA API server with exactly one compatibility fix: the GPU test's baseline (tests/test_slora_gpu.py).

    python tests/slora_stock_server.py <S-LoRA's api_server arguments>

S-LoRA's detokenizer process calls ``asyncio.get_event_loop()`` with no event loop set; with Python >= 3.12 and
uvloop >= 0.22 (S-LoRA installs uvloop's policy at import) that raises ``RuntimeError: There is no current event
loop``, so the stock server never answers. This runs ``slora.server.api_server.main`` unchanged except that its
detokenizer target is :func:`start_detokenization_process` below, which sets a fresh event loop and then calls
S-LoRA's own function. Nothing of DeltaServe is imported: the baseline is S-LoRA plus that one line.
(``deltaserve_slora.launch`` applies the same fix, recorded in ``deltaserve_slora.patches.PATCHES``.)

Other stock behaviour is left as it is, e.g. under spawn its router ignores ``--nccl_port`` (it binds the default
28765), so at most one stock server runs per machine, and ``--model_dir``'s folder name must contain 'llama'.
Run it as a script (not ``-m``): spawn re-imports this file in the detokenizer process as ``__mp_main__``, which is
where the pickled target ``__main__.start_detokenization_process`` is found.
"""

import asyncio
import sys


def start_detokenization_process(*args):  # noqa: ANN002, ANN201 - S-LoRA's signature, passed through
    # import first: S-LoRA's module installs uvloop's policy at import; a loop set before that would be invisible
    from slora.server.detokenization.manager import start_detokenization_process as stock

    asyncio.set_event_loop(asyncio.new_event_loop())
    return stock(*args)


if __name__ == "__main__":
    import torch.multiprocessing

    torch.multiprocessing.set_start_method("spawn")  # as api_server's own __main__
    from slora.server import api_server

    api_server.start_detokenization_process = start_detokenization_process
    sys.argv[0] = api_server.__file__
    api_server.main()
