"""DeltaServe adapter for S-LoRA: co-serve LoRA fine-tuning inside a stock S-LoRA checkout.

S-LoRA is on no package registry; the adapter locates a user's checkout (:mod:`.locate`), applies the run-time
wraps of :mod:`.patches` (the complete list, with why and what breaks each) before its router steps, and drives
it in-process (:mod:`.host`). Weight layouts between PEFT and S-LoRA's KV-pool adapter rows are in
:mod:`.layout`. The adapter translates only: admission, estimation and training are the core's.
Importing this package does not import S-LoRA.
"""

from __future__ import annotations

from .locate import ENV_VAR, TESTED_COMMITS, SloraNotFoundError, locate_slora

__all__ = ["ENV_VAR", "TESTED_COMMITS", "SloraNotFoundError", "locate_slora"]
