"""Fine-tuning data: load a corpus, tokenise it with the model's chat template, and keep the admission pool.

Three layers, each usable on its own and each in its own module:

1. :mod:`.records`: :func:`load_records` reads an Alpaca-format or ShareGPT/chat-format ``.json`` (a list) or
   ``.jsonl`` file and normalises every record to a list of ``{"role", "content"}`` messages. Malformed records
   are counted and reported by line number (JSONL) or list index (JSON) in a :class:`LoadReport`; they never
   raise and are never dropped without a trace. Only a dataset that cannot be used at all raises
   :class:`DatasetError`.
2. :mod:`.dataset`: :func:`tokenize_conversation` / :class:`FinetuneDataset` turn messages into
   :class:`~deltaserve_core.types.FineTuneSample` rows with a loss mask that covers assistant tokens only (the
   module says how the mask is placed), enforce ``max_length`` and count what was truncated or skipped.
3. :mod:`.pool`: :class:`FinetunePool` is what the scheduler extension admits from on every step: samples ordered
   by token count (ties in a seeded order), claimed while in flight, released on abort, completed after backward,
   with epoch tracking and a JSON-serialisable state that is saved with checkpoints. :class:`InMemoryPool` is the
   minimal reference pool with the same ``claim`` / ``release(sample_ids)`` interface.
"""

from .dataset import FinetuneDataset, tokenize_conversation
from .pool import FinetunePool, InMemoryPool, samples_fingerprint
from .records import ChatRecord, DataConfig, DatasetError, LoadReport, Problem, load_records

__all__ = [
    "DatasetError",
    "DataConfig",
    "Problem",
    "LoadReport",
    "ChatRecord",
    "load_records",
    "tokenize_conversation",
    "FinetuneDataset",
    "FinetunePool",
    "InMemoryPool",
    "samples_fingerprint",
]
