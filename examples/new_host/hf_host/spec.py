"""Registry entry of the transformers host. Imported by ``deltaserve hosts``, so it imports no engine."""

from deltaserve_core.registry import HostSpec

SPEC = HostSpec(
    name="hf",
    description="DeltaServe on plain Hugging Face transformers + PEFT (a small continuous-batching engine)",
    factory="hf_host.host:create_host",  # imported only when a host is created
    install_command="pip install -e examples/new_host",
    engine_distributions=("transformers",),
    supported=">=5.16.1,<5.20",  # what deltaserve pins and this host is tested against
    notes="worked example of examples/new_host/README.md: per-request forwards, no prefix cache, eager only",
    static_capabilities={"mixed_batches": "yes", "graph_modes": "eager", "abort": "yes", "devices": "cpu, cuda"},
)
