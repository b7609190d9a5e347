"""Images pinned by digest: the one mechanism for every image the tool takes from a registry (the image
base, recipes/image.toml; the builder vLLM is compiled in, recipes/builder.toml).

The lock step resolves the recipe's reference (a tag) to the platform's manifest and writes its digest,
its config's and its layers' into a lock file; a build downloads exactly those blobs into the verified
cache (or finds them there) and never asks for a tag.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_bundle.errors import (
    ImageError,
    LockError,
    LockMissingError,
    LockOutOfDateError,
    OfflineMissingError,
    RegistryError,
)
from vllm_bundle.manifests import dump_json
from vllm_bundle.oci.layout import BaseImage, Descriptor
from vllm_bundle.oci.registry import Reference, RegistryClient, mirrored, parse_document, platform_manifest
from vllm_bundle.util.cache import Cache
from vllm_bundle.util.fsutil import atomic_write
from vllm_bundle.util.policy import RetryPolicy


@dataclass(frozen=True)
class Pin:
    """What a recipe asks to pin: ``reference`` for ``platform``, locked into ``lock_file`` of the locks
    directory. ``what`` names it in messages ("the image base"); ``relock`` is the command that locks it."""

    reference: Reference
    platform: Mapping[str, str]
    lock_file: str
    what: str
    relock: str


@dataclass(frozen=True)
class ImageLock:
    reference: str  # as the recipe names it (a changed recipe makes the lock stale)
    platform: Mapping[str, str]
    index_digest: str | None
    manifest: Descriptor
    config: Descriptor
    layers: tuple[Descriptor, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "platform": dict(self.platform),
            "index_digest": self.index_digest,
            "manifest": self.manifest.to_json(),
            "config": self.config.to_json(),
            "layers": [layer.to_json() for layer in self.layers],
        }


def read_lock(locks_dir: Path, pin: Pin) -> ImageLock:
    """The lock, refusing a missing one or one made for another reference or platform. One with a
    descriptor that is not one (a digest other than ``sha256:<64 hex>`` would name a file) is refused as a
    hand-edited target lock is: a :class:`LockError` (exit 3), never silently replaced."""
    path = locks_dir / pin.lock_file
    if not path.exists():
        raise LockMissingError(f"no lock for {pin.what} at {path}", pin.relock)
    try:
        doc = json.loads(path.read_text())
        lock = ImageLock(
            reference=doc["reference"],
            platform=doc["platform"],
            index_digest=doc.get("index_digest"),
            manifest=Descriptor.from_json(doc["manifest"]),
            config=Descriptor.from_json(doc["config"]),
            layers=tuple(Descriptor.from_json(layer) for layer in doc["layers"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise LockOutOfDateError(f"{path} is not a lock of {pin.what} ({err})", pin.relock) from None
    except ImageError as err:
        raise LockError(f"{path}: {err.message}", f"{pin.relock} instead of editing the lock by hand") from None
    if lock.reference != str(pin.reference) or dict(lock.platform) != dict(pin.platform):
        raise LockOutOfDateError(
            f"the lock of {pin.what} pins {lock.reference} ({'/'.join(lock.platform.values())}) but its recipe "
            f"names {pin.reference} ({'/'.join(pin.platform.values())})",
            pin.relock,
        )
    return lock


def _manifest_blobs(data: bytes, what: str) -> tuple[Descriptor, tuple[Descriptor, ...]]:
    manifest = parse_document(data, what)
    try:
        config = Descriptor.from_json(manifest["config"])
        return config, tuple(Descriptor.from_json(layer) for layer in manifest.get("layers") or [])
    except (KeyError, TypeError, ValueError):
        raise RegistryError(f"{what} is not an image manifest (no config or layers)", "lock another image") from None


def lock_image(pin: Pin, locks_dir: Path, cache: Cache, mirror: str | None, policy: RetryPolicy) -> ImageLock:
    """Resolve the pin's reference to its platform manifest and write the lock."""
    reference, url = mirrored(pin.reference, mirror)
    client = RegistryClient(url, policy)
    data, media_type, digest, index = platform_manifest(client, reference.repository, reference.reference, pin.platform)
    config, layers = _manifest_blobs(data, str(pin.reference))
    config_doc = parse_document(client.blob_bytes(reference.repository, config, cache), f"{pin.reference} config")
    diff_ids = (config_doc.get("rootfs") or {}).get("diff_ids") or []
    if len(diff_ids) != len(layers):
        raise RegistryError(f"{pin.reference}: its config lists {len(diff_ids)} layers, its manifest {len(layers)}")
    cache.store(data, f"the manifest of {pin.reference}")
    lock = ImageLock(str(pin.reference), pin.platform, index, Descriptor(media_type, digest, len(data)), config, layers)
    locks_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(locks_dir / pin.lock_file, dump_json(lock.to_json()))
    return lock


def fetch_image(
    pin: Pin, lock: ImageLock, cache: Cache, mirror: str | None, policy: RetryPolicy, offline: bool
) -> BaseImage:
    """The image's manifest, config and layers from the cache, downloading by digest what it lacks. The
    manifest is checked to list exactly the locked config and layers (a lock edited by hand is refused)."""
    blobs = [lock.manifest, lock.config, *lock.layers]
    missing = [blob for blob in blobs if not cache.has(blob.digest.removeprefix("sha256:"), blob.size)]
    if missing and offline:
        raise OfflineMissingError(
            f"--offline: {len(missing)} blobs of {pin.what} {lock.reference} are not in the cache",
            "run once without --offline",
        )
    reference, url = mirrored(pin.reference, mirror)
    client = RegistryClient(url, policy)
    manifest_path = cache.blob(lock.manifest.digest.removeprefix("sha256:"))
    if lock.manifest in missing:
        data, _, _ = client.manifest(reference.repository, lock.manifest.digest)  # verified against the digest
        cache.store(data, f"the manifest of {lock.reference}")
    config, layers = _manifest_blobs(manifest_path.read_bytes(), lock.reference)
    if (config.digest, [layer.digest for layer in layers]) != (lock.config.digest, [x.digest for x in lock.layers]):
        raise LockOutOfDateError(
            f"the lock of {pin.what} does not list the blobs of the manifest {lock.manifest.digest} it pins",
            f"{pin.relock} (was the lock edited by hand?)",
        )
    paths = {blob.digest: client.blob_into(reference.repository, blob, cache) for blob in blobs[1:]}
    config_doc = parse_document(paths[lock.config.digest].read_bytes(), f"{lock.reference} config")
    return BaseImage(
        lock.reference, lock.manifest.digest, config_doc, [(layer, paths[layer.digest]) for layer in lock.layers]
    )
