"""The builder image vLLM is compiled in (recipes/builder.toml), pinned like every other image
(oci/pinned.py: locks/builder.json); tree/builder.py unpacks and runs it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vllm_bundle.errors import RecipeError, RegistryError
from vllm_bundle.oci.layout import BaseImage
from vllm_bundle.oci.pinned import Pin
from vllm_bundle.oci.registry import Reference
from vllm_bundle.recipes import Table, read_toml
from vllm_bundle.tree.builder import ImageFiles

RECIPE = "builder.toml"
LOCK = "builder.json"
RELOCK = "run `vllm-bundle lock --builder`, or pass --no-builder to compile vLLM on this machine"


@dataclass(frozen=True)
class BuilderRecipe:
    reference: Reference
    platform: dict[str, str]
    compilers: tuple[str, str]  # the host C and C++ compilers, by name

    @property
    def pin(self) -> Pin:
        return Pin(self.reference, self.platform, LOCK, "the builder image", RELOCK)


def load_builder_recipe(recipes_root: Path) -> BuilderRecipe:
    doc = Table.of(read_toml(recipes_root / RECIPE), RECIPE)
    image, compilers = doc.table("image"), doc.table("compilers")
    try:
        reference = Reference.parse(image.text("reference"))
    except RegistryError as err:
        raise RecipeError(f"{RECIPE}: image.reference: {err.message}", "fix the recipe") from None
    platform = image.table("platform")
    names = (compilers.text("cc"), compilers.text("cxx"))
    for key, name in zip(("cc", "cxx"), names, strict=True):
        if not name or "/" in name or name != name.strip():
            raise compilers.bad(key, "a program's name, found on the image's PATH (e.g. g++)")
    return BuilderRecipe(reference, {"architecture": platform.text("architecture"), "os": platform.text("os")}, names)


def image_files(image: BaseImage) -> ImageFiles:
    """What the builder stage unpacks and runs: the fetched image's layers, config environment and digest."""
    env = (image.config.get("config") or {}).get("Env") or []
    if not isinstance(env, list) or not all(isinstance(item, str) for item in env):
        raise RegistryError(f"the builder image {image.reference}: its config's Env is not a list of strings")
    layers = tuple((descriptor.media_type, path) for descriptor, path in image.layers)
    return ImageFiles(image.reference, image.manifest_digest, tuple(env), layers)
