"""The ``image`` stage: the bundle tree as an OCI image on a locked base, and its KServe manifests.

recipes/image.toml     the base reference, where the bundle goes, its environment, the layer rules
locks/image-base.json  the base resolved by the lock step: manifest digest, config and layer blobs
build/<target>/image/  oci/ (the image layout) and image.json (tag, digest, size, vLLM version, date)
build/<target>/kserve/ the ServingRuntime and InferenceService for the image (see :mod:`vllm_bundle.oci.kserve`)

The base is pinned like every other input: the lock names its manifest and blob digests; a build
downloads those blobs into the verified cache (or finds them there) and never asks for a tag.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vllm_bundle.errors import (
    ImageError,
    LockError,
    LockMissingError,
    LockOutOfDateError,
    OfflineMissingError,
    RecipeError,
    RegistryError,
)
from vllm_bundle.manifests import dump_json, read_json
from vllm_bundle.oci.layout import BaseImage, Descriptor, ImageSpec, LayerRule, iso_time, write_image
from vllm_bundle.oci.registry import Reference, RegistryClient, mirrored, parse_document, platform_manifest
from vllm_bundle.paths import checkout_git
from vllm_bundle.recipes import Table, read_toml
from vllm_bundle.release.archive import archiver
from vllm_bundle.tree.stage import StageResult, run_stage
from vllm_bundle.util.cache import Cache
from vllm_bundle.util.fsutil import atomic_write
from vllm_bundle.util.transport import RetryPolicy

STAGE_VERSION = 3  # 3: the stamp's details hold the whole image record
RECIPE = "image.toml"
BASE_LOCK = "image-base.json"
LAYOUT = "oci"
IMAGE_JSON = "image.json"


@dataclass(frozen=True)
class ImageRecipe:
    base: Reference
    platform: Mapping[str, str]
    prefix: str
    port: int
    env: Mapping[str, str]
    layers: tuple[LayerRule, ...]
    repository: str  # where releases push, "{repo}" standing for the GitHub owner/name

    @property
    def launcher(self) -> str:
        return f"{self.prefix}/bin/vllm-server"


def load_image_recipe(recipes_root: Path) -> ImageRecipe:
    path = recipes_root / RECIPE
    doc = Table(read_toml(path), RECIPE)
    base, image = doc.table("base"), doc.table("image")
    try:
        reference = Reference.parse(base.text("reference"))
    except RegistryError as err:
        raise RecipeError(f"{RECIPE}: base.reference: {err.message}", "fix the recipe") from None
    platform = base.table("platform")
    prefix = image.text("prefix")
    if not prefix.startswith("/") or prefix.rstrip("/") in ("", "/") or ".." in prefix.split("/"):
        raise image.fail("prefix", "an absolute directory other than / (e.g. /opt/vllm)")
    env = image.table("env")
    rules = [LayerRule(name, tuple(layer.strings("paths", ()))) for name, layer in _layers(doc)]
    if not rules or rules[-1].patterns:
        raise RecipeError(f"{RECIPE}: the last [[layer]] must have no paths (it takes the rest of the tree)")
    return ImageRecipe(
        base=reference,
        platform={"architecture": platform.text("architecture"), "os": platform.text("os")},
        prefix=prefix.rstrip("/"),
        port=int(image.number("port")),
        env={key: env.text(key) for key in env.data},
        layers=tuple(rules),
        repository=image.text("repository"),
    )


def _layers(doc: Table) -> list[tuple[str, Table]]:
    raw = doc.data.get("layer")
    if not isinstance(raw, list) or not raw:
        raise RecipeError(f"{RECIPE}: no [[layer]] tables", "name at least one layer")
    layers = []
    for number, item in enumerate(raw, start=1):
        if not isinstance(item, dict):
            raise RecipeError(f"bad recipe {RECIPE}: layer[{number}]: expected a table, got {item!r}")
        layer = Table(item, RECIPE, f"layer[{number}]")
        layers.append((layer.text("name"), layer))
    return layers


# -- the base image lock ------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseLock:
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


def base_lock_path(locks_dir: Path) -> Path:
    return locks_dir / BASE_LOCK


def read_base_lock(locks_dir: Path, recipe: ImageRecipe) -> BaseLock:
    """The base lock, refusing a missing one or one made for another reference or platform. One with a
    descriptor that is not one (a digest other than ``sha256:<64 hex>`` would name a file) is refused as a
    hand-edited target lock is: a :class:`LockError` (exit 3), never silently replaced."""
    path = base_lock_path(locks_dir)
    if not path.exists():
        raise LockMissingError(f"no lock for the image base at {path}", "run `vllm-bundle lock --image`")
    try:
        doc = json.loads(path.read_text())
        lock = BaseLock(
            reference=doc["reference"],
            platform=doc["platform"],
            index_digest=doc.get("index_digest"),
            manifest=Descriptor.from_json(doc["manifest"]),
            config=Descriptor.from_json(doc["config"]),
            layers=tuple(Descriptor.from_json(layer) for layer in doc["layers"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise LockOutOfDateError(f"{path} is not a base image lock ({err})", "run `vllm-bundle lock --image`") from None
    except ImageError as err:
        raise LockError(
            f"{path}: {err.message}", "run `vllm-bundle lock --image` instead of editing the lock by hand"
        ) from None
    if lock.reference != str(recipe.base) or dict(lock.platform) != dict(recipe.platform):
        raise LockOutOfDateError(
            f"the image base lock pins {lock.reference} ({'/'.join(lock.platform.values())}) but {RECIPE} names "
            f"{recipe.base} ({'/'.join(recipe.platform.values())})",
            "run `vllm-bundle lock --image`",
        )
    return lock


def _manifest_blobs(data: bytes, what: str) -> tuple[Descriptor, tuple[Descriptor, ...]]:
    manifest = parse_document(data, what)
    try:
        config = Descriptor.from_json(manifest["config"])
        return config, tuple(Descriptor.from_json(layer) for layer in manifest.get("layers") or [])
    except (KeyError, TypeError, ValueError):
        raise RegistryError(f"{what} is not an image manifest (no config or layers)", "lock another base") from None


def lock_base(recipe: ImageRecipe, locks_dir: Path, cache: Cache, mirror: str | None, policy: RetryPolicy) -> BaseLock:
    """Resolve the recipe's base reference to its platform manifest and write the lock."""
    reference, url = mirrored(recipe.base, mirror)
    client = RegistryClient(url, policy)
    data, media_type, digest, index = platform_manifest(
        client, reference.repository, reference.reference, recipe.platform
    )
    config, layers = _manifest_blobs(data, str(recipe.base))
    config_doc = parse_document(client.blob_bytes(reference.repository, config, cache), f"{recipe.base} config")
    diff_ids = (config_doc.get("rootfs") or {}).get("diff_ids") or []
    if len(diff_ids) != len(layers):
        raise RegistryError(f"{recipe.base}: its config lists {len(diff_ids)} layers, its manifest {len(layers)}")
    cache.store(data, f"the manifest of {recipe.base}")
    lock = BaseLock(str(recipe.base), recipe.platform, index, Descriptor(media_type, digest, len(data)), config, layers)
    locks_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(base_lock_path(locks_dir), dump_json(lock.to_json()))
    return lock


def fetch_base(
    recipe: ImageRecipe, lock: BaseLock, cache: Cache, mirror: str | None, policy: RetryPolicy, offline: bool
) -> BaseImage:
    """The base's manifest, config and layers from the cache, downloading by digest what it lacks. The
    manifest is checked to list exactly the locked config and layers (a lock edited by hand is refused)."""
    blobs = [lock.manifest, lock.config, *lock.layers]
    missing = [blob for blob in blobs if not cache.has(blob.digest.removeprefix("sha256:"), blob.size)]
    if missing and offline:
        raise OfflineMissingError(
            f"--offline: {len(missing)} blobs of the image base {lock.reference} are not in the cache",
            "run once without --offline",
        )
    reference, url = mirrored(recipe.base, mirror)
    client = RegistryClient(url, policy)
    manifest_path = cache.blob(lock.manifest.digest.removeprefix("sha256:"))
    if lock.manifest in missing:
        data, _, _ = client.manifest(reference.repository, lock.manifest.digest)  # verified against the digest
        cache.store(data, f"the manifest of {lock.reference}")
    config, layers = _manifest_blobs(manifest_path.read_bytes(), lock.reference)
    if (config.digest, [layer.digest for layer in layers]) != (lock.config.digest, [x.digest for x in lock.layers]):
        raise LockOutOfDateError(
            f"the image base lock does not list the blobs of the manifest {lock.manifest.digest} it pins",
            "run `vllm-bundle lock --image` (was the lock edited by hand?)",
        )
    paths = {blob.digest: client.blob_into(reference.repository, blob, cache) for blob in blobs[1:]}
    config_doc = parse_document(paths[lock.config.digest].read_bytes(), f"{lock.reference} config")
    return BaseImage(
        lock.reference, lock.manifest.digest, config_doc, [(layer, paths[layer.digest]) for layer in lock.layers]
    )


# -- the stage ----------------------------------------------------------------------------------


def revision() -> str:
    """The commit of the checkout this tool runs from ("" outside one): the image's revision label."""
    return checkout_git("rev-parse", "HEAD")


def image_spec(
    recipe: ImageRecipe,
    *,
    tag: str,
    target: str,
    isas: Sequence[str],
    versions: Mapping[str, str],
    repo: str,
    source_date: int,
    base: BaseImage,
    revision: str,
) -> ImageSpec:
    labels = {
        "org.opencontainers.image.title": f"vLLM for AMD {target}",
        "org.opencontainers.image.description": (
            f"vLLM {versions['vllm']} with TheRock ROCm {versions['rocm']} for {target}"
        ),
        "org.opencontainers.image.version": tag,
        "org.opencontainers.image.ref.name": tag,
        "org.opencontainers.image.source": f"https://github.com/{repo}",
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.base.name": base.reference,
        "org.opencontainers.image.base.digest": base.manifest_digest,
    }
    annotations = {
        **{key: value for key, value in labels.items() if key != "org.opencontainers.image.ref.name"},
        "org.opencontainers.image.created": iso_time(source_date),
        "dev.vllm-bundle.target": target,
        "dev.vllm-bundle.isas": ",".join(sorted(isas)),
        "dev.vllm-bundle.vllm": versions["vllm"],
        "dev.vllm-bundle.rocm": versions["rocm"],
    }
    return ImageSpec(
        prefix=recipe.prefix,
        entrypoint=(recipe.launcher,),
        env=recipe.env,
        ports=(recipe.port,),
        labels={key: value for key, value in labels.items() if value},
        annotations={key: value for key, value in annotations.items() if value},
        source_date=source_date,
        tag=tag,
        platform=recipe.platform,
    )


def image_stage(
    root: StageResult,
    base: BaseImage,
    spec: ImageSpec,
    rules: Sequence[LayerRule],
    level: int,
    out: Path,
    force: bool = False,
) -> StageResult:
    inputs = {
        "root": root.key,
        "base": base.manifest_digest,
        "spec": asdict(spec),
        "rules": [asdict(rule) for rule in rules],
        "level": level,
        "archiver": archiver(),
    }

    def build(tmp: Path) -> Mapping[str, Any]:
        manifest = write_image(root.path, tmp / LAYOUT, base, spec, rules, level)
        record = {
            "tag": spec.tag,
            "digest": manifest.digest,
            "size": manifest.size,
            "vllm": spec.annotations["dev.vllm-bundle.vllm"],
            "created": spec.annotations["org.opencontainers.image.created"],
        }
        (tmp / IMAGE_JSON).write_bytes(dump_json(record))
        return record  # kept in the stamp: the push reads it from the stage's result, not image.json

    return run_stage(out, "image", STAGE_VERSION, inputs, build, force=force)


def read_image_record(image_dir: Path) -> dict[str, Any]:
    """image.json of an image stage's output: tag, digest, size, vLLM version (for a build run by another
    process, as verify-repro's; a build in this one has them in its stage result, BundleRun.image)."""
    return read_json(image_dir / IMAGE_JSON)


def image_reference(repository: str, repo: str, tag: str, digest: str) -> str:
    """``registry/repository:tag@digest``, the recipe's ``{repo}`` filled in (lower case: GHCR's rule)."""
    return f"{repository.replace('{repo}', repo).lower()}:{tag}@{digest}"
