"""h25: model_spec().path is the model's served name, not the checkpoint folder.

Rule (types.py, ModelSpec): "``path`` is a local transformers checkpoint folder (the backward process loads or maps
the base weights from it when the host cannot share its own tensors)".

Bug: the adapter fills ``path`` from the name the engine serves the model under (vLLM's ``served_model_name``,
which defaults to the last component of the model path here), so the backward process gets a bare name that is
not a folder (or resolves relative to whatever directory it runs in).
Trigger: every host (the spec is read once per start); visible whenever the backward loads the base itself.
"""
import dataclasses
import os

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def model_spec(self):
        spec = super().model_spec()
        served = str(self.config.options.get("served_model_name") or os.path.basename(os.path.normpath(spec.path)))
        return dataclasses.replace(spec, path=served)
