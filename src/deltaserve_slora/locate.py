"""Finding the user's S-LoRA checkout and checking it is the tested one.

S-LoRA is on no package registry (PyPI's ``slora`` 0.0.1.dev0 is an unrelated empty placeholder), so it is located:
``--slora-path`` / ``HostConfig.options["slora_path"]``, else ``$DELTASERVE_SLORA_PATH``, else an importable
``slora`` package. The checkout must have its CUDA extension built (``slora/_kernels*.so``); DeltaServe never
builds into or edits it (``benchmarks/gpu/slora_h200.sh`` builds a copy).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ENV_VAR", "TESTED_COMMITS", "SloraCheckout", "SloraNotFoundError", "activate", "locate_slora"]

ENV_VAR = "DELTASERVE_SLORA_PATH"

#: S-LoRA commits the adapter is tested against (GitHub S-LoRA/S-LoRA; the last commit, 2024-01-03).
TESTED_COMMITS: dict[str, str] = {"c1ddf488781ea7f551cd0bb07bfd097124c93411": "2024-01-03"}

#: Files whose methods patches.py wraps, with their sha256 at the tested commit: a checkout without git metadata
#: (a `git archive` copy) is identified by these, and any edit of an attach point is caught before start-up.
ATTACH_FILES: dict[str, str] = {
    "slora/server/router/manager.py": "9139cdc23f4fb44afe320cc8b5f800c18a6e5eb7cd892f56462d75b1c4ed93e7",
    "slora/server/router/req_queue.py": "50b156bdad1df12be8e7ab19ff8e90bc7b8bdb723c4e75073691f7c3c06c564d",
    "slora/server/router/model_infer/model_rpc.py": "93f8e2ed6b51e8ef6dbc5d4773d4c07ca9dbf71a34393bee741fc50be79a4375",
    "slora/models/peft/lora_unordered_batch_infer.py": "80befd4aa4030c8e749fd609b5ed2ae8ec43d816992eef96f552e520ef5b5ca6",
    "slora/server/router/model_infer/infer_adapter.py": "dc3fa719a407bcaf85215c814bc569430455696fed1c4141c9b66db5fb3ea842",
    "slora/server/io_struct.py": "9f4d96a0194697e26ebe155811c7c717580ea92a6b64a95e75894b1c68d65292",
}

_BUILD_HINT = ("build its CUDA extension first: `cd <checkout> && TORCH_CUDA_ARCH_LIST=9.0 python setup.py build_ext "
               "--inplace` (or run benchmarks/gpu/slora_h200.sh, which builds a trimmed copy)")


class SloraNotFoundError(RuntimeError):
    """No usable S-LoRA checkout: says where it looked and how to point DeltaServe at one."""


@dataclass(frozen=True)
class SloraCheckout:
    root: Path  # the folder that contains the `slora` package
    commit: str | None  # git commit when the checkout has git metadata (or a COMMIT file), else None
    attach_sha256: dict[str, str]
    kernels: Path | None  # the built extension, None when not built

    @property
    def tested(self) -> bool:
        if self.commit is not None:
            return self.commit in TESTED_COMMITS
        return all(not want or self.attach_sha256.get(f) == want for f, want in ATTACH_FILES.items())

    def describe(self) -> str:
        return f"S-LoRA at {self.root} (commit {self.commit or 'unknown'})"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"


def _commit(root: Path) -> str | None:
    for candidate in (root / "COMMIT", root / ".slora_commit"):
        if candidate.is_file():
            return candidate.read_text().strip() or None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def inspect_checkout(root: Path) -> SloraCheckout:
    """Describe the checkout at ``root`` (which holds ``slora/``) without importing it."""
    root = root.resolve()
    if not (root / "slora" / "server" / "router" / "manager.py").is_file():
        raise SloraNotFoundError(f"{root} is not an S-LoRA checkout: slora/server/router/manager.py is missing "
                                 "(point at the folder that contains setup.py and the `slora` package)")
    kernels = next(iter(sorted((root / "slora").glob("_kernels*.so"))), None)
    return SloraCheckout(root=root, commit=_commit(root),
                         attach_sha256={f: _sha256(root / f) for f in ATTACH_FILES}, kernels=kernels)


def locate_slora(path: str | os.PathLike[str] | None = None) -> SloraCheckout:
    """Find S-LoRA: ``path``, else ``$DELTASERVE_SLORA_PATH``, else an importable ``slora``. Raises with all three."""
    tried: list[str] = []
    for label, candidate in (("--slora-path/slora_path option", path), (f"${ENV_VAR}", os.environ.get(ENV_VAR))):
        if candidate:
            p = Path(candidate).expanduser()
            if not p.exists():
                raise SloraNotFoundError(f"{label} points at {p}, which does not exist")
            return inspect_checkout(p)
        tried.append(f"{label}: not set")
    spec = importlib.util.find_spec("slora")
    if spec is not None and spec.submodule_search_locations:
        pkg = Path(next(iter(spec.submodule_search_locations)))
        if (pkg / "server" / "router" / "manager.py").is_file():
            return inspect_checkout(pkg.parent)
        tried.append(f"importable `slora` at {pkg} is not S-LoRA (PyPI's `slora` is an empty placeholder)")
    else:
        tried.append("no importable `slora` package")
    raise SloraNotFoundError(
        "S-LoRA was not found (" + "; ".join(tried) + "). S-LoRA is on no package registry: clone "
        "https://github.com/S-LoRA/S-LoRA, " + _BUILD_HINT + ", then pass --slora-path PATH (host option "
        f"slora_path=PATH) or set {ENV_VAR}=PATH")


def activate(checkout: SloraCheckout, *, require_kernels: bool = True) -> None:
    """Put the checkout first on ``sys.path`` (before any ``slora`` import) and refuse an unbuilt or untested one."""
    if require_kernels and checkout.kernels is None:
        raise SloraNotFoundError(f"{checkout.describe()} has no built CUDA extension (slora/_kernels*.so): "
                                 + _BUILD_HINT)
    if not checkout.tested:
        changed = [f for f, want in ATTACH_FILES.items() if want and checkout.attach_sha256.get(f) != want]
        raise SloraNotFoundError(
            f"{checkout.describe()} is not a tested S-LoRA (tested commits: "
            f"{', '.join(f'{c[:7]} ({d})' for c, d in TESTED_COMMITS.items())}"
            + (f"; attach-point files differ: {changed}" if changed else "")
            + "). deltaserve_slora wraps S-LoRA internals listed in docs/slora-adapter.md; check out a tested commit")
    root = str(checkout.root)
    loaded = sys.modules.get("slora")
    if loaded is not None and getattr(loaded, "__path__", None):
        where = Path(next(iter(loaded.__path__))).resolve().parent
        if where != checkout.root:
            raise SloraNotFoundError(f"a different `slora` ({where}) is already imported in this process; "
                                     f"cannot switch to {checkout.root}")
    if root not in sys.path:
        sys.path.insert(0, root)
