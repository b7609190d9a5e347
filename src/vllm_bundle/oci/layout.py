"""An OCI image layout (image-spec v1.1) of a bundle tree on a base image: deterministic layers,
config, manifest and index, written without a container engine.

Hand-written: an image is a few JSON documents and tar+gzip blobs. The daemonless builders (buildah,
kaniko, ko) are Go programs outside the registries this project installs from, and they lay a tree
out as one layer per build step, not as layers split by path with our archive's normalisation; the
Python OCI library (oras) pushes artifacts but does not build images.

Determinism: every layer is written by the archive module's entry functions (sorted names, one fixed
mtime, uid/gid 0, modes from the owner's exec bit) and its fixed-worker zlib-ng gzip; JSON documents
are canonical (sorted keys, no spaces); the config's times are the source date. A layer whose files did
not change is the same blob in the next release, whatever its date (tarstream.RELEASED_MTIME). Same
tree, base and labels: the same bytes, so the same manifest digest, on any machine.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import posixpath
import re
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from zlib_ng import gzip_ng_threaded

from vllm_bundle.errors import ImageError
from vllm_bundle.release.archive import add_entry, interrupt_between_reads
from vllm_bundle.util.fsutil import link_or_copy
from vllm_bundle.util.gzip_members import COMPRESSION_WORKERS
from vllm_bundle.util.tarstream import RELEASED_MTIME, StreamTar, tar_entry, tree_entries

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
#: Docker's names for the same layer bytes; the image is written with OCI's.
LAYER_TYPES = {
    "application/vnd.docker.image.rootfs.diff.tar.gzip": LAYER_GZIP,
    LAYER_GZIP: LAYER_GZIP,
    "application/vnd.oci.image.layer.v1.tar+zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.v1.tar": "application/vnd.oci.image.layer.v1.tar",
}
REF_NAME = "org.opencontainers.image.ref.name"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
LAYER_NAME = "dev.vllm-bundle.layer"


def canonical_json(document: Mapping[str, Any]) -> bytes:
    """The one serialisation of a document: its digest is the image's identity."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str  # "sha256:<hex>"
    size: int
    annotations: Mapping[str, str] = field(default_factory=dict)
    platform: Mapping[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.annotations:
            doc["annotations"] = dict(self.annotations)
        if self.platform:
            doc["platform"] = dict(self.platform)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Descriptor:
        """A descriptor read from a lock, a registry or a layout: its digest names files, so anything but
        ``sha256:<64 hex>`` is refused before it is used."""
        try:
            digest, media_type, size = str(doc["digest"]), str(doc["mediaType"]), int(doc["size"])
            annotations = dict(doc.get("annotations") or {})
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ImageError(
                f"not an OCI descriptor: {str(doc)[:120]}", "lock again from a registry you trust"
            ) from None
        if not DIGEST.fullmatch(digest):
            raise ImageError(f"{digest!r} is not a sha256 digest", "lock again from a registry you trust")
        return cls(media_type, digest, size, annotations)


@dataclass(frozen=True)
class LayerRule:
    """Bundle paths (relative to its root, fnmatch patterns) that go into one layer; a rule with no
    patterns takes everything the rules before it did not."""

    name: str
    patterns: tuple[str, ...]

    def takes(self, rel: str) -> bool:
        if not self.patterns:
            return True
        ancestors = [rel]
        while "/" in ancestors[-1]:
            ancestors.append(posixpath.dirname(ancestors[-1]))
        return any(fnmatch.fnmatchcase(path, pattern) for path in ancestors for pattern in self.patterns)


@dataclass(frozen=True)
class BaseImage:
    """The locked base: its config document and its layers, each with the cached file of its bytes."""

    reference: str
    manifest_digest: str
    config: Mapping[str, Any]
    layers: Sequence[tuple[Descriptor, Path]]


@dataclass(frozen=True)
class ImageSpec:
    prefix: str  # where the bundle root goes, e.g. "/opt/vllm"
    entrypoint: Sequence[str]
    env: Mapping[str, str]
    ports: Sequence[int]
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    source_date: int
    tag: str
    platform: Mapping[str, str] = field(default_factory=lambda: {"architecture": "amd64", "os": "linux"})


@dataclass
class _Digesting:
    """A write-only stream that hashes and counts what passes through it."""

    sink: Any
    digest: Any = field(default_factory=hashlib.sha256)
    size: int = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        written: int = self.sink.write(data)
        return written

    def flush(self) -> None:
        self.sink.flush()


class Layout:
    """An OCI image layout directory being written (the caller owns the directory)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self.blobs.mkdir(parents=True, exist_ok=True)

    def blob_path(self, digest: str) -> Path:
        return self.blobs / digest.removeprefix("sha256:")

    def add_bytes(self, media_type: str, data: bytes, annotations: Mapping[str, str] | None = None) -> Descriptor:
        digest = sha256_digest(data)
        self.blob_path(digest).write_bytes(data)
        return Descriptor(media_type, digest, len(data), annotations or {})

    def add_file(self, descriptor: Descriptor, source: Path) -> None:
        """A blob whose bytes are already verified elsewhere (the download cache): linked, else copied."""
        target = self.blob_path(descriptor.digest)
        if target.exists():
            return
        link_or_copy(source, target)

    def finish(self, manifest: Descriptor) -> None:
        (self.root / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
        index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [manifest.to_json()]}
        (self.root / "index.json").write_bytes(canonical_json(index))


def split_tree(root: Path, rules: Sequence[LayerRule]) -> list[tuple[LayerRule, list[tuple[str, Path]]]]:
    """The tree's entries per layer (rules without entries are left out), each list sorted by name and
    holding the directories above its entries, so that every layer unpacks on its own."""
    if not rules or rules[-1].patterns:
        raise ImageError("the last layer rule must take the rest of the tree (no paths)", "fix recipes/image.toml")
    entries = list(tree_entries(root))
    by_name = dict(entries)
    groups: list[set[str]] = [set() for _ in rules]
    for name, _ in entries[1:]:  # entries[0] is the root itself
        rel = name[2:]
        index = next(i for i, rule in enumerate(rules) if rule.takes(rel))
        groups[index].add(name)
        parent = posixpath.dirname(rel)
        while parent:
            groups[index].add("./" + parent)
            parent = posixpath.dirname(parent)
    return [
        (rule, [("./", root), *((name, by_name[name]) for name in sorted(group))])
        for rule, group in zip(rules, groups, strict=True)
        if group
    ]


def _prefix_dirs(prefix: str) -> list[tarfile.TarInfo]:
    """Directory entries for ``opt``, ``opt/vllm``... above the bundle root (the root is the last)."""
    parts = prefix.strip("/").split("/")
    infos = []
    for depth in range(1, len(parts)):
        info = tarfile.TarInfo("/".join(parts[:depth]))
        info.type, info.mode, info.mtime, info.uname, info.gname = tarfile.DIRTYPE, 0o755, RELEASED_MTIME, "", ""
        infos.append(info)
    return infos


def _in_image(name: str, prefix: str) -> str:
    """``./bin/x`` (or ``.``) in the bundle as its path in the image (``opt/vllm/bin/x``)."""
    rel = "" if name in (".", "./") else name.removeprefix("./")
    return posixpath.join(prefix.strip("/"), rel) if rel else prefix.strip("/")


def write_layer(
    layout: Layout, root: Path, entries: Iterable[tuple[str, Path]], prefix: str, level: int
) -> tuple[Path, int, str, str]:
    """One layer blob (tar+gzip) in the layout's blob directory; returns (path, size, digest, diff_id).

    Hard links are kept within the layer; a second name whose first name is in another layer is
    stored as a file of its own (a link across layers would not unpack on its own)."""
    temp = layout.blobs / ".layer.tmp"
    seen: dict[tuple[int, int], str] = {}
    try:
        with (
            temp.open("wb") as raw,
            interrupt_between_reads() as interrupted,
        ):
            compressed = _Digesting(raw)
            with gzip_ng_threaded.open(compressed, "wb", compresslevel=level, threads=COMPRESSION_WORKERS) as gz:  # type: ignore[no-untyped-call]
                plain = _Digesting(gz)
                with StreamTar.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                    for info in _prefix_dirs(prefix):
                        tar.addfile(info)
                    for name, path in entries:
                        if interrupted.is_set():
                            raise KeyboardInterrupt
                        info = tar_entry(name, path, root, seen)
                        info.name = _in_image(info.name, prefix)
                        if info.islnk():
                            info.linkname = _in_image(info.linkname, prefix)
                        add_entry(tar, info, path, interrupted)
        digest = "sha256:" + compressed.digest.hexdigest()
        final = layout.blob_path(digest)
        temp.replace(final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return final, compressed.size, digest, "sha256:" + plain.digest.hexdigest()


def iso_time(epoch: int) -> str:
    """The OCI spec's RFC 3339 form of a source date."""
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _merged_env(base: Sequence[str], ours: Mapping[str, str]) -> list[str]:
    """The base's environment with ours set over it (a key keeps its place; new keys follow)."""
    merged = {item.partition("=")[0]: item.partition("=")[2] for item in base}
    merged.update(ours)
    return [f"{key}={value}" for key, value in merged.items()]


def image_config(base: BaseImage, spec: ImageSpec, diff_ids: Sequence[str], layer_names: Sequence[str]) -> bytes:
    """The image config: the base's run settings and layers, then ours (entrypoint, env, labels)."""
    base_run = dict(base.config.get("config") or {})
    base_rootfs = base.config.get("rootfs") or {}
    base_diff_ids = list(base_rootfs.get("diff_ids") or [])
    if len(base_diff_ids) != len(base.layers):
        raise ImageError(
            f"the base image {base.reference} lists {len(base_diff_ids)} layers in its config but "
            f"{len(base.layers)} in its manifest",
            "lock another base image",
        )
    created = iso_time(spec.source_date)
    run = {key: value for key, value in base_run.items() if key not in ("Cmd", "Entrypoint", "Healthcheck")}
    run["Entrypoint"] = list(spec.entrypoint)
    run["Env"] = _merged_env(base_run.get("Env") or [], spec.env)
    run["Labels"] = {**(base_run.get("Labels") or {}), **spec.labels}
    run["ExposedPorts"] = {f"{port}/tcp": {} for port in spec.ports}
    history = list(base.config.get("history") or [])
    history += [{"created": created, "created_by": f"vllm-bundle: {name} layer"} for name in layer_names]
    config = {
        "created": created,
        "architecture": spec.platform["architecture"],
        "os": spec.platform["os"],
        "config": run,
        "rootfs": {"type": "layers", "diff_ids": [*base_diff_ids, *diff_ids]},
        "history": history,
    }
    return canonical_json(config)


def write_image(
    tree: Path, out: Path, base: BaseImage, spec: ImageSpec, rules: Sequence[LayerRule], level: int
) -> Descriptor:
    """Write the OCI layout of ``tree`` on ``base`` into the empty directory ``out``; returns the
    manifest's descriptor (its digest is the image's)."""
    layout = Layout(out)
    layers: list[Descriptor] = []
    for descriptor, path in base.layers:
        media_type = LAYER_TYPES.get(descriptor.media_type)
        if media_type is None:
            raise ImageError(
                f"the base image {base.reference} has a layer of type {descriptor.media_type}",
                "lock a base image with tar, tar+gzip or tar+zstd layers",
            )
        layout.add_file(descriptor, path)
        layers.append(Descriptor(media_type, descriptor.digest, descriptor.size))
    diff_ids, names = [], []
    for rule, entries in split_tree(tree, rules):
        _, size, digest, diff_id = write_layer(layout, tree, entries, spec.prefix, level)
        layers.append(Descriptor(LAYER_GZIP, digest, size, {LAYER_NAME: rule.name}))
        diff_ids.append(diff_id)
        names.append(rule.name)
    config = layout.add_bytes(CONFIG, image_config(base, spec, diff_ids, names))
    manifest_doc = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": config.to_json(),
        "layers": [layer.to_json() for layer in layers],
        "annotations": dict(spec.annotations),
    }
    manifest = layout.add_bytes(MANIFEST, canonical_json(manifest_doc))
    tagged = Descriptor(MANIFEST, manifest.digest, manifest.size, {REF_NAME: spec.tag}, spec.platform)
    layout.finish(tagged)
    return tagged


def read_layout(root: Path) -> tuple[Descriptor, dict[str, Any]]:
    """The (single) manifest of a layout written by :func:`write_image`, with its document."""
    try:
        index = json.loads((root / "index.json").read_bytes())
        (entry,) = index["manifests"]
        descriptor = Descriptor.from_json(entry)
        manifest = json.loads((root / "blobs" / "sha256" / descriptor.digest.removeprefix("sha256:")).read_bytes())
    except (OSError, ValueError, KeyError) as err:
        raise ImageError(f"{root} is not an image layout written by vllm-bundle ({err})", "build it again") from None
    return descriptor, manifest


def layout_blobs(root: Path) -> list[Descriptor]:
    """Every blob the layout's manifest needs, the manifest itself last (the order a push needs)."""
    descriptor, manifest = read_layout(root)
    blobs = [Descriptor.from_json(manifest["config"]), *(Descriptor.from_json(doc) for doc in manifest["layers"])]
    return [*blobs, descriptor]


def open_blob(root: Path, digest: str) -> BinaryIO:
    return (root / "blobs" / "sha256" / digest.removeprefix("sha256:")).open("rb")
