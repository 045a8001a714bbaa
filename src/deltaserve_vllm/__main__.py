"""``python -m deltaserve_vllm serve MODEL ...``: vLLM's own CLI on every supported build (see :mod:`.launch`)."""

import sys

from .launch import main

if __name__ == "__main__":  # vLLM's spawned processes import this module again as __mp_main__
    sys.exit(main())
