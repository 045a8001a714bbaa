"""Publishing adapter versions for clients: one servable version per checkpoint or every few steps, the newest
``checkpoint.keep`` kept, older ones retired (withdrawn, then deleted after a grace period), and a restarted job
serving again what it published before.

:class:`PublishingMixin` is part of :class:`~deltaserve_core.coserve.CoServer`; its state lives there.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from .adapter_state import LoraAdapterState, all_finite
from .hostkit import publish_dir

__all__ = ["RETIRED_GRACE_S", "RETIRED_MARK", "PublishingMixin", "delete_retired"]

log = logging.getLogger("deltaserve.coserve")


#: file in a published version's folder once it is pruned: clients can no longer request it
RETIRED_MARK = ".retired"
#: how long a retired version's folder stays for requests that were already running on it
RETIRED_GRACE_S = 600.0


def delete_retired(root: Path, grace_s: float = RETIRED_GRACE_S) -> list[Path]:
    """Delete published folders retired more than ``grace_s`` ago; returns them."""
    gone = []
    now = time.time()
    for mark in root.glob(f"*/{RETIRED_MARK}") if root.is_dir() else ():
        try:
            if now - mark.stat().st_mtime >= grace_s:
                shutil.rmtree(mark.parent, ignore_errors=True)
                gone.append(mark.parent)
        except OSError:
            continue
    return gone


class PublishingMixin:
    """Publish, prune and republish adapter versions (see the module docs)."""

    def _publish(self, step: int) -> None:
        assert self.backward is not None
        if step <= self._published_step:
            return  # two checkpoints of one step (e.g. periodic + final) publish once
        snapshot = self.backward.adapter_snapshot(version=step)
        if not all_finite(snapshot.tensors.values()):
            # clients would get NaN logits under a valid-looking version name
            self.stats.publish_refused += 1
            log.error("not publishing %s@v%d: the adapter holds non-finite values", self.job.adapter_name, step)
            self.events.add("error", f"not published: the adapter at step {step} holds non-finite values")
            return
        try:
            name = self.host.publish_adapter(snapshot)
        except OSError as exc:
            # A full or broken disk under the host's publish folder: this runs inside the host's step, which must
            # not fail for it. The version is not published; the next checkpoint's publish tries again.
            self.stats.publish_failures += 1
            log.error("could not publish %s@v%d: %s", self.job.adapter_name, step, exc)
            self.events.add("error", f"could not publish the adapter at step {step}: {exc}")
            return
        self._published_step = step
        self.stats.publishes += 1
        durable = publish_dir(self.job) / name
        if not (durable / "adapter_config.json").is_file():
            # Hosts that publish into their own temp folder: the copy here is what a restart serves again.
            try:
                snapshot.save_pretrained(durable)
            except OSError as exc:
                log.error("published %s, but could not keep a copy in %s for restarts: %s", name, durable, exc)
        if name in self.stats.published:
            self.stats.published.remove(name)  # republished (a restarted job redoing a step): newest last
        self.stats.published.append(name)
        log.debug("published adapter %s", name)
        self._published_log[name] = {"name": name, "step": step, "loss": self._loss_at(step),
                                     "created_at": int(time.time())}
        self.events.add("info", f"published {name}: request it as model {name!r}", data={"model": name, "step": step})
        self._prune_published()

    def _prune_published(self) -> None:
        """Keep the newest ``checkpoint.keep`` published versions servable; older ones are withdrawn from the host
        (new requests for them are refused) and marked retired, and their folders deleted once retired for
        :data:`RETIRED_GRACE_S`: a request already running on a version may need its folder again (an engine
        reloads an evicted adapter from it, and fails the step if it is gone)."""
        keep = self.job.checkpoint.keep
        root = publish_dir(self.job)
        while len(self.stats.published) > keep:
            name = self.stats.published.pop(0)
            try:
                self.host.retract_adapter(name)
            except Exception as exc:  # noqa: BLE001 - it is retired anyway; clients get a 404 either way
                log.warning("host could not withdraw adapter %s: %s", name, exc)
            try:
                (root / name / RETIRED_MARK).touch()
            except OSError:
                pass  # no folder (the host wrote none and the copy failed): nothing to serve or delete
            log.info("retired published adapter %s (checkpoint.keep=%d)", name, keep)
        delete_retired(root)

    def _republish_from_disk(self, resumed_step: int) -> None:
        """Serve again the versions an earlier run of this job published (newest ``checkpoint.keep``)."""
        root = publish_dir(self.job)
        found = []
        for folder in root.glob(f"{self.job.adapter_name}@v*") if root.is_dir() else ():
            tail = folder.name[len(self.job.adapter_name) + 2:]
            if (tail.isdigit() and (folder / "adapter_config.json").is_file() and int(tail) != resumed_step
                    and not (folder / RETIRED_MARK).exists()):
                found.append((int(tail), folder))
        for version, folder in sorted(found)[-self.job.checkpoint.keep:]:
            try:
                state = LoraAdapterState.load_pretrained(folder, name=self.job.adapter_name, version=version)
                name = self.host.publish_adapter(state)
            except Exception as exc:  # noqa: BLE001 - one unreadable folder must not stop the server
                log.warning("could not serve again published adapter %s: %s", folder, exc)
                continue
            self.stats.published.append(name)
            self._published_step = max(self._published_step, version)
        if found:
            log.info("serving again %d adapter versions published before the restart", len(self.stats.published))
