"""Small, real artifacts in upstream's formats: wheels with RECORD, sdists, tarballs, ELF libraries.

Everything is deterministic (fixed timestamps, sorted entries) so that fixture hashes are stable
within a run and tests can compare bytes.
"""

from __future__ import annotations

import base64
import hashlib
import io
import shutil
import subprocess
import tarfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

FIXED_ZIP_TIME = (2025, 11, 20, 0, 0, 0)
FIXED_EPOCH = 1763596800  # 2025-11-20T00:00:00Z

Content = bytes | Path


def _bytes(content: Content) -> bytes:
    return content.read_bytes() if isinstance(content, Path) else content


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    out_dir: Path,
    name: str,
    version: str,
    tag: str,
    files: Mapping[str, Content],
    requires: tuple[str, ...] = (),
    entry_points: Mapping[str, Mapping[str, str]] | None = None,
    executables: tuple[str, ...] = (),
) -> Path:
    """A wheel as pip/uv expect it: METADATA, WHEEL, entry points and a RECORD of every file."""
    dist = name.replace("-", "_")
    filename = f"{dist}-{version}-{tag}.whl"
    info = f"{dist}-{version}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {req}" for req in requires]
    contents: dict[str, bytes] = {path: _bytes(data) for path, data in sorted(files.items())}
    contents[f"{info}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    wheel_tags = [f"Tag: {t}" for t in _expand_tag(tag)]
    contents[f"{info}/WHEEL"] = (
        "\n".join(["Wheel-Version: 1.0", "Generator: vllm-bundle-tests", "Root-Is-Purelib: false", *wheel_tags]) + "\n"
    ).encode()
    if entry_points:
        lines = []
        for group, entries in entry_points.items():
            lines.append(f"[{group}]")
            lines += [f"{key} = {value}" for key, value in entries.items()]
        contents[f"{info}/entry_points.txt"] = ("\n".join(lines) + "\n").encode()
    record = [f"{path},{_record_hash(data)},{len(data)}" for path, data in contents.items()]
    record.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / filename
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, data in contents.items():
            entry = zipfile.ZipInfo(member, FIXED_ZIP_TIME)
            mode = 0o755 if member in executables or data.startswith(b"\x7fELF") else 0o644
            entry.external_attr = (0o100000 | mode) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, data)
    return path


def _expand_tag(tag: str) -> list[str]:
    py, abi, plats = tag.split("-")
    return [f"{p}-{abi}-{plat}" for p in py.split(".") for plat in plats.split(".")]


def make_tarball(
    path: Path,
    files: Mapping[str, Content],
    modes: Mapping[str, int] | None = None,
    symlinks: Mapping[str, str] | None = None,
    compressed: bool = True,
) -> Path:
    """A tarball (gzip unless not ``compressed``) with sorted entries, fixed mtimes and root ownership."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dirs: set[str] = set()
    for name in [*files, *(symlinks or {})]:
        parts = name.split("/")[:-1]
        dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    with tarfile.open(path, "w:gz" if compressed else "w", format=tarfile.PAX_FORMAT) as archive:
        for name in sorted(dirs):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, FIXED_EPOCH
            archive.addfile(info)
        for name, content in sorted(files.items()):
            data = _bytes(content)
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), FIXED_EPOCH
            info.mode = (modes or {}).get(name, 0o755 if data.startswith(b"\x7fELF") else 0o644)
            archive.addfile(info, io.BytesIO(data))
        for name, target in sorted((symlinks or {}).items()):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, FIXED_EPOCH
            archive.addfile(info)
    return path


def compile_shared(
    out: Path,
    soname: str,
    source: str,
    needed: tuple[Path, ...] = (),
    rpath: str | None = None,
    executable: bool = False,
    python_headers: str | None = None,
    system_libraries: tuple[str, ...] = (),
) -> Path:
    """Compile a real ELF shared library (or executable) with DT_NEEDED entries on ``needed`` (files) and
    ``system_libraries`` (sonames of this machine's libraries, e.g. ``libz.so.1``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(out.suffix + ".c")
    src.write_text(source)
    command = ["gcc", "-O1", "-o", str(out), str(src)]
    command += [] if executable else ["-shared", "-fPIC"] + ([f"-Wl,-soname,{soname}"] if soname else [])
    command += [f"-I{python_headers}"] if python_headers else []
    command.append("-Wl,--no-as-needed")  # keep every DT_NEEDED asked for, used or not (as real wheels have)
    for lib in needed:
        command += [f"-L{lib.parent}", f"-l:{lib.name}"]
    command += [f"-l:{soname}" for soname in system_libraries]
    if rpath:
        command.append(f"-Wl,-rpath,{rpath}")
    command.append("-Wl,--build-id=none")
    subprocess.run(command, check=True, capture_output=True)
    src.unlink()
    return out


def needing_version(out: Path, symbol: str, library: str, version: str) -> Path:
    """A real shared object that calls ``symbol`` of ``library`` at ``version`` (``strlcpy``, ``libc.so.6``,
    ``GLIBC_2.38``), whatever this machine's own library has: linked, with this machine's gcc and ld,
    against a stub ``library`` that defines the symbol under that version (a version script), as zig
    links against the glibc of any version it is asked for (ziglang/zig lib/libc/glibc/abilists: stubs
    built from each version's symbol list). Its .gnu.version_r says ``library`` ``version``, as a file
    compiled against that glibc does."""
    stub = out.parent / f".{out.name}.stub"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "stub.c").write_text(f"void {symbol}(void) {{}}\n")
    (stub / "version.map").write_text(f"{version} {{ global: {symbol}; }};\n")
    flags = ["-shared", "-fPIC", "-nostdlib", "-Wl,--build-id=none"]
    script = f"-Wl,--version-script={stub / 'version.map'}"
    subprocess.run(
        ["gcc", *flags, "-o", str(stub / library), str(stub / "stub.c"), script, f"-Wl,-soname,{library}"],
        check=True,
        capture_output=True,
    )
    (stub / "use.c").write_text(f"void {symbol}(void);\nvoid vllm_bundle_uses_it(void) {{ {symbol}(); }}\n")
    link = [f"-L{stub}", f"-l:{library}"]
    subprocess.run(["gcc", *flags, "-o", str(out), str(stub / "use.c"), *link], check=True, capture_output=True)
    shutil.rmtree(stub)
    return out


def make_tarball_from_tree(path: Path, tree: Path) -> Path:
    """A gzip tarball of everything under ``tree`` (names relative to it), sorted, fixed mtimes, root
    ownership; file modes and symlinks kept."""

    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = FIXED_EPOCH, 0, 0, "root", "root"
        return info

    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as archive:
        for member in sorted(tree.rglob("*")):
            archive.add(member, arcname=str(member.relative_to(tree)), recursive=False, filter=normalise)
    return path
