"""The ``image`` stage: the bundle tree as an OCI image on a locked base, and its KServe manifests.

recipes/image.toml     the base reference, where the bundle goes, its environment, the layer rules
locks/image-base.json  the base resolved by the lock step: manifest digest, config and layer blobs
build/<target>/image/  oci/ (the image layout) and image.json (tag, digest, size, vLLM version, date)
build/<target>/kserve/ the ServingRuntime and InferenceService for the image (see :mod:`vllm_bundle.oci.kserve`)

The base is pinned like every other input, as every image the tool takes is (oci/pinned.py): the lock
names its manifest and blob digests; a build downloads those blobs into the verified cache (or finds them
there) and never asks for a tag.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vllm_bundle.errors import RecipeError, RegistryError
from vllm_bundle.manifests import dump_json, read_json
from vllm_bundle.oci.layout import BaseImage, ImageSpec, LayerRule, iso_time, write_image
from vllm_bundle.oci.pinned import ImageLock, Pin, fetch_image, read_lock
from vllm_bundle.oci.registry import Reference
from vllm_bundle.paths import checkout_git
from vllm_bundle.recipes import Table, read_toml
from vllm_bundle.release.archive import archiver
from vllm_bundle.tree.stage import StageResult, run_stage
from vllm_bundle.util.cache import Cache
from vllm_bundle.util.policy import RetryPolicy

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
    doc = Table.of(read_toml(path), RECIPE)
    base, image = doc.table("base"), doc.table("image")
    try:
        reference = Reference.parse(base.text("reference"))
    except RegistryError as err:
        raise RecipeError(f"{RECIPE}: base.reference: {err.message}", "fix the recipe") from None
    platform = base.table("platform")
    prefix = image.text("prefix")
    if not prefix.startswith("/") or prefix.rstrip("/") in ("", "/") or ".." in prefix.split("/"):
        raise image.bad("prefix", "an absolute directory other than / (e.g. /opt/vllm)")
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
    layers = doc.tables("layer", required=False)
    if not layers:
        raise RecipeError(f"{RECIPE}: no [[layer]] tables", "name at least one layer")
    return [(layer.text("name"), layer) for layer in layers]


# -- the base image lock ------------------------------------------------------------------------


def base_pin(recipe: ImageRecipe) -> Pin:
    return Pin(recipe.base, recipe.platform, BASE_LOCK, "the image base", "run `vllm-bundle lock --image`")


def base_lock_path(locks_dir: Path) -> Path:
    return locks_dir / BASE_LOCK


def read_base_lock(locks_dir: Path, recipe: ImageRecipe) -> ImageLock:
    """The base lock (:func:`vllm_bundle.oci.pinned.read_lock`)."""
    return read_lock(locks_dir, base_pin(recipe))


def fetch_base(
    recipe: ImageRecipe, lock: ImageLock, cache: Cache, mirror: str | None, policy: RetryPolicy, offline: bool
) -> BaseImage:
    """The base's manifest, config and layers from the cache, downloading by digest what it lacks."""
    return fetch_image(base_pin(recipe), lock, cache, mirror, policy, offline)


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
    *,
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
    process, as verify-repro's; a build in this one has them in its stage result, BundleRun.result("image"))."""
    return read_json(image_dir / IMAGE_JSON)


def image_reference(repository: str, repo: str, tag: str, digest: str) -> str:
    """``registry/repository:tag@digest``, the recipe's ``{repo}`` filled in (lower case: GHCR's rule)."""
    return f"{repository.replace('{repo}', repo).lower()}:{tag}@{digest}"
