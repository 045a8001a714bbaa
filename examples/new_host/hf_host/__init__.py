"""DeltaServe on plain Hugging Face transformers: the worked example of ``examples/new_host/README.md``."""
