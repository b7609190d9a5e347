"""The fixture ``rocm`` sdist's ``rocm_sdk/_devel.py``: how TheRock's SDK expands its devel part on first
use, as TheRock's own code does it (ROCm/TheRock@89553ce build_tools/packaging/python/templates/
rocm/src/rocm_sdk/_devel.py and __main__.py):

- ``rocm-sdk path --root|--bin|--cmake`` and ``rocm-sdk init`` first expand ``rocm_sdk_devel/_devel.tar``
  (or ``.tar.xz``) into the site-packages directory that holds it, as the package ``_rocm_sdk_devel``;
- "already expanded" means ``_rocm_sdk_devel/__init__.py`` exists and the tarball is gone;
- file symlinks in the tar become hard links (so tools run from the devel tree see it as their ROCm
  root), except ``_rocm_sdk_devel/bin/amd*`` compiler links; directory symlinks stay symlinks;
- a ``<name>,,`` row is appended to the rocm-sdk-devel wheel's RECORD for every file and symlink, and the
  tarball is deleted last;
- every installed ``rocm-sdk-device-*`` wheel's ``.devel_links/<isa>.json`` is linked into the devel tree,
  and a row for each link is appended to **that device wheel's** RECORD.

So running ``rocm-sdk path --root`` with an interpreter writes into its site-packages, RECORD files of
other wheels included.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import tarfile
from pathlib import Path

PRESERVE_SYMLINKS = ("amdclang", "amdclang++", "amdclang-cl", "amdclang-cpp", "amdflang", "amdlld", "amdllvm")
DEVEL = "_rocm_sdk_devel"


def _tarball(package: Path) -> Path | None:
    for name in ("_devel.tar.xz", "_devel.tar"):
        if (package / name).exists():
            return package / name
    return None


def _record_of(distribution: str) -> Path:
    files = md.files(distribution) or []
    record = next((f for f in files if str(f).endswith(".dist-info/RECORD")), None)
    if record is None:
        raise ImportError(f"No distribution RECORD found for {distribution}")
    return Path(str(record.locate()))


def _expand(tar_path: Path, site: Path) -> None:
    with tarfile.open(tar_path) as archive, _record_of("rocm-sdk-devel").open("at") as record:
        for member in archive:
            dest = site / member.name
            if member.issym():
                dest.parent.mkdir(parents=True, exist_ok=True)
                target = dest.parent / member.linkname
                preserved = dest.name in PRESERVE_SYMLINKS and dest.parent == site / DEVEL / "bin"
                if preserved:
                    dest.symlink_to(member.linkname)
                elif target.is_file():
                    dest.hardlink_to(target.resolve())
                else:
                    dest.symlink_to(member.linkname)
            else:
                archive.extract(member, path=site, filter="fully_trusted")
            if member.isfile() or member.issym():
                record.write(f"{member.name},,\n")
    tar_path.unlink()


def _reconcile_device_links(site: Path, devel: Path) -> None:
    for distribution in md.distributions(path=[str(site)]):
        name = distribution.metadata["Name"]
        if not name.startswith("rocm-sdk-device-"):
            continue
        manifest = site / "_rocm_sdk_libraries" / ".devel_links" / f"{name.removeprefix('rocm-sdk-device-')}.json"
        if not manifest.exists():
            continue
        with _record_of(name).open("at") as record:
            for link in json.loads(manifest.read_text())["links"]:
                dest = devel / link["relpath"]
                if dest.exists():
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.hardlink_to((dest.parent / link["target"]).resolve())
                record.write(f"{dest.relative_to(site)},,\n")


def get_devel_root() -> Path:
    import rocm_sdk_devel  # type: ignore[import-not-found]  # the devel wheel's package

    package = Path(rocm_sdk_devel.__file__).parent
    site = package.parent
    devel = site / DEVEL
    tarball = _tarball(package)
    if tarball is not None or not (devel / "__init__.py").exists():
        if tarball is None:
            raise ImportError(f"the rocm[devel] package at {package} has neither {DEVEL} nor its tarball")
        _expand(tarball, site)
    _reconcile_device_links(site, devel)
    return devel
