"""The fixture's builder images, served by the loopback registry under the name of TheRock's build image
(recipes/builder.toml's ``rocm/therock_build_manylinux_x86_64``), so that a bundle build pins, fetches,
unpacks and runs them as it does TheRock's: TheRock's image is on ghcr.io, which is not reachable from here.

What they are: Debian's own root file systems, made from Debian's archive (the one source of a real build
machine reachable from here) with mmdebstrap: bookworm (glibc 2.36, the fixture's floor: its CPython is a
copy of this Debian 12 machine's) and trixie (glibc 2.41, whose headers redirect ``strtoull`` to
``__isoc23_strtoull``, GLIBC_2.38), each with g++ and GNU patch. Over Debian's files one layer of the
fixture's, modelled on what TheRock's image has and the build relies on (ROCm/TheRock@89553ce
dockerfiles/build_manylinux_x86_64.Dockerfile):

- GCC first on the PATH of the image's config, from gcc-toolset-13's directory (lines 81-89, 118-123): here
  the g++ that compiles the fixture's stand-in units (stand_ins.py), around Debian's;
- a cmake of the image's own on that PATH (line 18: ``/usr/local/therock-tools/bin``, CMake 3.27.9): here
  one that fails, naming itself, as the suite's host cmake does (the build must use the locked one);
- the fake SDK compiler's own files at ``therock.IMAGE_TOOLCHAIN``, where its wrappers look first (TheRock's
  clang carries them inside its wheel; the fake's cannot).

The layers are uncompressed tars (``application/vnd.oci.image.layer.v1.tar``): a registry and the builder
stage take any layer media type, and gzip would cost seconds at every run for nothing the tests look at.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from .registry import RegistryServer, skopeo
from .stand_ins import host_compiler
from .therock import IMAGE_TOOLCHAIN

REPOSITORY = "rocm/therock_build_manylinux_x86_64"  # recipes/builder.toml's, on the mirrored registry
#: Debian suite -> the tag its image is served under: bookworm stands for the recipe's `latest`.
TAGS = {"bookworm": "latest", "trixie": "trixie"}
GLIBC = {"bookworm": "2.36", "trixie": "2.41"}
PACKAGES = ("g++", "patch")
GCC_TOOLSET_BIN = "/opt/rh/gcc-toolset-13/root/usr/bin"
THEROCK_TOOLS_BIN = "/usr/local/therock-tools/bin"
PATH = f"{GCC_TOOLSET_BIN}:{THEROCK_TOOLS_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGE_CMAKE = """#!/bin/sh
echo "error: the builder image's own cmake was run ($0 $*): the build uses the locked one" >&2
exit 1
"""
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
MTIME = 1_700_000_000
#: Less of Debian than a machine carries: documentation and translations (dpkg's path-exclude).
DPKG_EXCLUDES = ("/usr/share/man/*", "/usr/share/doc/*", "/usr/share/locale/*", "/usr/share/info/*")


def debian_layer(suite: str, out: Path) -> Path:
    """A tar of Debian ``suite``'s root file system with PACKAGES (mmdebstrap, as root: CI runs the suite as
    root for its mounts too)."""
    if shutil.which("mmdebstrap") is None:
        raise RuntimeError(
            "the builder tests make Debian root file systems with mmdebstrap (apt-get install mmdebstrap; .ci/run does)"
        )
    if os.getuid() != 0:
        raise RuntimeError("mmdebstrap makes the builder images' root file systems as root (CI runs the tests as root)")
    command = ["mmdebstrap", "--quiet", "--mode=root", "--variant=essential", f"--include={','.join(PACKAGES)}"]
    command += [f"--dpkgopt=path-exclude={pattern}" for pattern in DPKG_EXCLUDES]
    command += ['--aptopt=Acquire::Languages "none"', suite, str(out), "http://deb.debian.org/debian"]
    out.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"mmdebstrap {suite} failed: {(result.stderr or result.stdout)[-2000:]}")
    return out


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, MTIME
    tar.addfile(info, io.BytesIO(data))


def _add_dirs(tar: tarfile.TarFile, path: str, made: set[str]) -> None:
    parts = path.strip("/").split("/")
    for depth in range(1, len(parts) + 1):
        name = "/".join(parts[:depth])
        if name not in made:
            made.add(name)
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, MTIME
            tar.addfile(info)


def fixture_layer(sdk_clang: Path, out: Path) -> Path:
    """The fixture's layer (see the module's docstring): the stand-in g++ and Debian's gcc in gcc-toolset's
    directory, the image's own cmake, and the SDK compiler's files at IMAGE_TOOLCHAIN."""
    made: set[str] = set()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        _add_dirs(tar, GCC_TOOLSET_BIN, made)
        _add(tar, f"{GCC_TOOLSET_BIN.strip('/')}/g++", host_compiler("/usr/bin/g++").encode())
        gcc = tarfile.TarInfo(f"{GCC_TOOLSET_BIN.strip('/')}/gcc")
        gcc.type, gcc.linkname, gcc.mtime = tarfile.SYMTYPE, "/usr/bin/gcc", MTIME
        tar.addfile(gcc)
        _add_dirs(tar, THEROCK_TOOLS_BIN, made)
        _add(tar, f"{THEROCK_TOOLS_BIN.strip('/')}/cmake", IMAGE_CMAKE.encode())
        _add_dirs(tar, IMAGE_TOOLCHAIN, made)
        for path in sorted(sdk_clang.rglob("*")):
            name = f"{IMAGE_TOOLCHAIN.strip('/')}/{path.relative_to(sdk_clang)}"
            if path.is_dir() and not path.is_symlink():
                _add_dirs(tar, name, made)
            else:
                tar.add(path, arcname=name, recursive=False, filter=_normalised)
    return out


def _normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = MTIME, 0, 0, "root", "root"
    return info


def _blob(layout: Path, data: bytes | Path) -> dict[str, object]:
    if isinstance(data, Path):
        digest = _file_digest(data)
        target = layout / "blobs" / "sha256" / digest
        if not target.exists():
            os.link(data, target) if data.stat().st_dev == layout.stat().st_dev else shutil.copyfile(data, target)
        return {"digest": f"sha256:{digest}", "size": data.stat().st_size}
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _file_digest(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_layout(layout: Path, layers: list[Path], tag: str) -> Path:
    """An OCI layout of one linux/amd64 image of ``layers`` (uncompressed tars, lowest first), its config
    with TheRock's PATH order, under ``tag``."""
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    descriptors = [{"mediaType": LAYER_TYPE, **_blob(layout, layer)} for layer in layers]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "2026-08-18T00:00:00Z",
        "config": {"Env": [f"PATH={PATH}", "LC_ALL=C.UTF-8"], "Cmd": ["/bin/bash"]},
        "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in descriptors]},  # uncompressed: the same
        "history": [
            {"created": "2026-08-18T00:00:00Z", "created_by": f"vllm-bundle tests: {layer.name}"} for layer in layers
        ],
    }
    config_desc = {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        **_blob(layout, json.dumps(config).encode()),
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": descriptors,
    }
    manifest_desc = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        **_blob(layout, json.dumps(manifest).encode()),
        "annotations": {"org.opencontainers.image.ref.name": tag},
    }
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]}))
    return layout


def publish_builder(registry: RegistryServer, suite: str, sdk_clang: Path, work: Path) -> str:
    """Debian ``suite``'s builder image, pushed to ``registry`` (skopeo) as ``REPOSITORY:<its tag>``; returns
    the tag. ``work``: where its layers are made (removed after; the fixture's layer comes out the same bytes
    for every suite, one blob in the registry)."""
    work.mkdir(parents=True, exist_ok=True)
    tag = TAGS[suite]
    layers = [debian_layer(suite, work / f"{suite}.tar"), fixture_layer(sdk_clang, work / "fixture.tar")]
    layout = write_layout(work / f"{suite}-layout", layers, tag)
    destination = f"docker://{registry.host}/{REPOSITORY}:{tag}"
    # --preserve-digests: the layers go up as they are (uncompressed), not gzipped by skopeo on the way
    skopeo("copy", "--dest-tls-verify=false", "--preserve-digests", f"oci:{layout}:{tag}", destination, timeout=600)
    shutil.rmtree(work)  # the next suite's image makes its layers anew: the registry has this one's
    return tag
