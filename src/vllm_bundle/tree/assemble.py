"""The assembly stages: ``site`` (CPython + the locked wheels), ``app`` (+ vLLM, relocated, pruned)
and ``root`` (+ the launcher). Each starts from a hard-linked copy of the one before, so an unchanged
earlier stage costs no copying; a file that is edited is first given its own copy (relocate.unshare).

Wheels are installed with pypa/installer: exactly the locked files (hashes were checked when they
entered the cache, and each file is checked against its wheel's RECORD as it is written), no index, no
dependency resolution.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import uv
from installer import install
from installer.destinations import SchemeDictionaryDestination
from installer.exceptions import InstallerError
from installer.records import Hash, RecordEntry
from installer.sources import WheelContentElement, WheelFile
from installer.utils import Scheme, copyfileobj_with_hashing

from vllm_bundle.errors import AssembleError
from vllm_bundle.recipes import AttentionRule, ServerRule
from vllm_bundle.tree.launcher import render_launcher, runtime_files
from vllm_bundle.tree.layout import Layout, library_dirs
from vllm_bundle.tree.patches import Outcome, Patch, apply_fixes, installed_rocm_version, read_series
from vllm_bundle.tree.prune import PruneRules, prune
from vllm_bundle.tree.records import refresh_records
from vllm_bundle.tree.relocate import check_no_build_paths, fix_rpaths, fix_shebangs
from vllm_bundle.tree.stage import StageResult, file_digest, run_stage
from vllm_bundle.tree.toolchain import WRAPPER, ZIG, render_wrapper, write_wrapper
from vllm_bundle.util.fetch import require_sha256

STAGE_VERSION = 6
AMD_SMI_PTH = "vllm-bundle-amd-smi.pth"


def link_tree(src: Path, dest: Path) -> None:
    """Copy a tree as hard links (symlinks kept as symlinks); dest must not exist."""
    shutil.copytree(src, dest, symlinks=True, copy_function=os.link, dirs_exist_ok=True)


def install_wheels(layout: Layout, wheels: Sequence[Path]) -> None:
    # No spaces (installer would write its own trampoline): fix_shebangs replaces this line.
    install_into(layout.scheme(), f"/bin/python{layout.minor}", wheels)


class _SharedFilesDestination(SchemeDictionaryDestination):
    """pypa/installer's destination, but a file an earlier wheel of the same install wrote with the very
    same bytes is no conflict: TheRock's rocm-sdk-libraries and every rocm-sdk-device-* wheel ship one
    empty ``_rocm_sdk_libraries/__init__.py`` (their setup.py package the same platform directory; pip
    overwrites it). A different file at the same path is still refused."""

    def write_to_fs(self, scheme: Scheme, path: str, stream: BinaryIO, is_executable: bool) -> RecordEntry:
        # installer's own path, made by its own check (ValueError "Attempting to write ... outside of the
        # target directory"), before anything is looked at there: else a ``../x`` member whose target
        # exists outside the stage was compared with it, installed and recorded when its bytes matched,
        # and said to differ when they did not, telling the wheel's author what is outside (issue #51).
        target = self._path_with_destdir(scheme, path)
        if not target.exists():
            return super().write_to_fs(scheme, path, stream, is_executable)
        with tempfile.TemporaryFile() as incoming:
            digest, size = copyfileobj_with_hashing(stream, incoming, self.hash_algorithm)
        with target.open("rb") as existing:
            present = base64.urlsafe_b64encode(hashlib.file_digest(existing, self.hash_algorithm).digest())
        if present.decode().rstrip("=") != digest:
            raise FileExistsError(f"{path} is shipped by an earlier wheel with other bytes")
        return RecordEntry(path, Hash(self.hash_algorithm, digest), size)


class RecordMismatch(ValueError):
    """A wheel's file whose sha256 or size is not the one its RECORD gives."""


class _RecordCheckedStream:
    """A wheel file's stream that checks the sha256 and size RECORD gives once it is read to its end (a
    seek to the start, as installer's shebang fix does, starts the count again).

    Written by hand because pypa/installer checks RECORD only in a pass of its own
    (``validate_record(validate_contents=True)``) that inflates and hashes every file before the install
    inflates and hashes it again: that doubled the time of every install, and a real torch wheel is
    gigabytes."""

    def __init__(self, stream: BinaryIO, entry: RecordEntry) -> None:
        assert entry.hash_ is not None  # (get_contents wraps only files RECORD gives a hash)
        self._stream, self._expected, self._expected_size, self.path = stream, entry.hash_, entry.size, entry.path
        self.checked = False
        self._restart()

    def _restart(self) -> None:
        self._digest, self._size = hashlib.new(self._expected.name), 0

    def read(self, size: int | None = -1) -> bytes:
        data = self._stream.read(-1 if size is None else size)
        self._count(data, at_end=not data or size is None or size < 0)
        return data

    def readline(self, size: int | None = -1) -> bytes:
        data = self._stream.readline(-1 if size is None else size)
        self._count(data, at_end=not data)
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if (offset, whence) != (0, os.SEEK_SET):
            raise OSError(f"{self.path}: only a seek to the start is checked against RECORD")
        self._restart()
        return self._stream.seek(0)

    def _count(self, data: bytes, at_end: bool) -> None:
        self._digest.update(data)
        self._size += len(data)
        if at_end:
            value = base64.urlsafe_b64encode(self._digest.digest()).decode().rstrip("=")
            if value != self._expected.value or self._size != self._expected_size:
                raise RecordMismatch(f"hash / size of {self.path} didn't match RECORD")
            self.checked = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _RecordCheckedWheel(WheelFile):
    """pypa/installer's wheel source whose files check themselves against RECORD as the install reads them."""

    def __init__(self, f: zipfile.ZipFile) -> None:
        super().__init__(f)
        self.streams: list[_RecordCheckedStream] = []

    def get_contents(self) -> Iterator[WheelContentElement]:
        for record, stream, is_executable in super().get_contents():
            if not record[1]:  # RECORD itself (validate_record refuses any other file without a hash)
                yield record, stream, is_executable
                continue
            checked = _RecordCheckedStream(stream, RecordEntry.from_elements(*record))
            self.streams.append(checked)
            yield record, checked, is_executable  # type: ignore[misc]

    def unchecked(self) -> list[str]:
        return [stream.path for stream in self.streams if not stream.checked]


def install_into(scheme: Mapping[str, str], interpreter: str, wheels: Sequence[Path]) -> None:
    """Install ``wheels`` with pypa/installer into the ``scheme`` directories: RECORD names every file with
    its hash and size (checked first), and each file is checked against it as it is written."""
    destination = _SharedFilesDestination(dict(scheme), interpreter=interpreter, script_kind="posix")
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as archive:
                source = _RecordCheckedWheel(archive)
                source.validate_record(validate_contents=False)
                install(source, destination, additional_metadata={"INSTALLER": b"vllm-bundle\n"})
                unchecked = source.unchecked()
                if unchecked:
                    raise RecordMismatch(f"{unchecked[0]} was not read to its end to check it")
        except (InstallerError, ValueError, OSError, zipfile.BadZipFile) as err:
            raise AssembleError(f"cannot install {wheel.name}: {err}", "re-fetch it, or re-lock") from None


def expose_amd_smi(layout: Layout) -> bool:
    """Make the ROCm SDK's ``share/amd_smi`` package importable as ``amdsmi`` (vLLM's ROCm detection)."""
    if not (layout.site / "_rocm_sdk_core" / "share" / "amd_smi").is_dir():
        return False
    (layout.site / AMD_SMI_PTH).write_text("_rocm_sdk_core/share/amd_smi\n")
    return True


@dataclass(frozen=True)
class SdkFixes:
    outcomes: list[Outcome]
    files: list[Path]  # the files the applied fixes changed, whose RECORD rows are re-hashed


def apply_sdk_fixes(site: Path, series: list[list[Patch]]) -> SdkFixes:
    """The fixes of ``series`` the installed SDK's version needs, applied to ``site`` (patches/rocm-sdk)."""
    if not series:
        return SdkFixes([], [])
    version = installed_rocm_version(site)
    if version is None:
        raise AssembleError(
            "cannot tell which fixes the ROCm SDK needs: site-packages holds no one rocm distribution",
            "check the lock's rocm sdist",
        )
    outcomes = apply_fixes(site, series, version)
    applied = {o.variant for o in outcomes if o.status == "applied"}
    files = [site / f for group in series for p in group if p.path.name in applied for f in p.files]
    return SdkFixes(outcomes, files)


def build_sdist_wheel(sdist: Path, filename: str, out_dir: Path, source_date: int, target_family: str) -> Path:
    """A pure-Python wheel from a locked sdist (TheRock's ``rocm`` meta package, published only as an
    sdist), built by uv with the setuptools of this tool's own locked environment, no network,
    ``SOURCE_DATE_EPOCH`` set and ``ROCM_SDK_TARGET_FAMILY`` given (else its setup.py asks this
    machine's GPU through ``offload-arch``, rocm_sdk/_dist_info.py): the same bytes on every machine."""
    work = out_dir / f".build-{filename}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    named = work / filename  # the cache blob is named by its hash; uv reads the name
    shutil.copyfile(sdist, named)
    command = [uv.find_uv_bin(), "build", "--no-build-isolation", "--no-config", "--offline", "--wheel"]
    command += ["--python", sys.executable, "--out-dir", str(out_dir), str(named)]
    env = {
        **os.environ,
        "SOURCE_DATE_EPOCH": str(source_date),
        "UV_PYTHON_DOWNLOADS": "never",
        "ROCM_SDK_TARGET_FAMILY": target_family,
    }
    before = set(out_dir.glob("*.whl"))
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    shutil.rmtree(work, ignore_errors=True)
    wheels = sorted(set(out_dir.glob("*.whl")) - before)
    if result.returncode != 0 or len(wheels) != 1:
        raise AssembleError(
            f"cannot build a wheel from {filename}: {_build_failure(result.stderr)}", "re-lock, or report the sdist"
        )
    return wheels[0]


#: The line of a Python traceback that says what went wrong (``ValueError: ...``).
EXCEPTION_LINE = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception)|[\w.]*Exit)\b.*", re.MULTILINE)


def _build_failure(stderr: str) -> str:
    """What a failed ``uv build`` says went wrong: the build backend's exception line (``ValueError:
    Requested ROCM_SDK_TARGET_FAMILY=...``), not uv's closing hint."""
    raised = [match.group(0).strip() for match in EXCEPTION_LINE.finditer(stderr)]
    if raised:
        return raised[-1]
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.strip().startswith("hint:")]
    return lines[-1] if lines else "no wheel"


def site_stage(
    python: StageResult,
    wheels: Mapping[Path, str],
    minor: str,
    sdists: Mapping[Path, tuple[str, str]] | None = None,
    source_date: int = 0,
    target_family: str = "",
    *,
    out: Path,
    force: bool = False,
    fixes: Path | None = None,
) -> StageResult:
    """``wheels``: each wheel file with its pinned sha256 (the stage's key: a wheel re-published under
    the same name with other bytes redoes the stage); ``sdists``: cache blob -> (sha256, file name) of
    locked source releases built into wheels here. Every input is checked before it is used. Console
    scripts get the relocatable trampoline here already: the vLLM build runs some (ninja). ``fixes``: the
    series of fixes to the installed ROCm SDK (patches/rocm-sdk), applied for the SDK version installed."""
    sdists = dict(sdists or {})
    series = read_series(fixes) if fixes else []
    inputs = {
        "python": python.key,
        "wheels": {path.name: sha for path, sha in sorted(wheels.items())},
        "sdists": {name: sha for sha, name in sorted(sdists.values())},
        "source_date": source_date,
        "target_family": target_family,
        "fixes": file_digest(fixes / "series", *(p.path for group in series for p in group)) if fixes else "",
    }

    def build(tmp: Path) -> Mapping[str, Any]:
        for wheel, sha256 in wheels.items():
            require_sha256(wheel, sha256, wheel.name)
        for sdist, (sha256, filename) in sdists.items():
            require_sha256(sdist, sha256, filename)
        built = tmp.parent / f".{tmp.name}.sdist-wheels"
        shutil.rmtree(built, ignore_errors=True)
        try:
            from_sdists = [
                build_sdist_wheel(s, name, built, source_date, target_family) for s, (_, name) in sorted(sdists.items())
            ]
            link_tree(python.path, tmp)
            layout = Layout(tmp, minor)
            install_wheels(layout, [*wheels, *from_sdists])
        finally:
            shutil.rmtree(built, ignore_errors=True)
        fixed = apply_sdk_fixes(layout.site, series)
        refresh_records(layout.site, {*fix_shebangs(tmp, f"python{minor}"), *fixed.files})
        return {
            "wheels": len(wheels) + len(from_sdists),
            "amd_smi": expose_amd_smi(layout),
            "rocm_fixes": [o.__dict__ for o in fixed.outcomes],
        }

    return run_stage(out, "site", STAGE_VERSION, inputs, build, force=force)


def app_stage(
    site: StageResult,
    vllm_wheel: StageResult,
    minor: str,
    rules: PruneRules,
    build_dir: Path,
    *,
    out: Path,
    force: bool = False,
) -> StageResult:
    wheel = vllm_wheel.path / str(vllm_wheel.details["wheel"])
    inputs = {"site": site.key, "vllm": vllm_wheel.key, "drop": rules.drop, "keep": rules.keep}

    def build(tmp: Path) -> Mapping[str, Any]:
        link_tree(site.path, tmp)
        layout = Layout(tmp, minor)
        install_wheels(layout, [wheel])
        shebangs = fix_shebangs(tmp, f"python{minor}")
        rpaths = fix_rpaths(tmp, build_dir)
        report = prune(tmp, rules)
        refresh_records(layout.site, {*shebangs, *rpaths})
        check_no_build_paths(tmp, build_dir)
        return {"shebangs": len(shebangs), "rpaths": len(rpaths), "sizes": report}

    return run_stage(out, "app", STAGE_VERSION, inputs, build, force=force)


def require_toolchain(layout: Layout) -> None:
    """The C compiler the wrapper runs is installed: without it Triton's first compile fails on any host
    without a C toolchain, long after the bundle shipped."""
    zig = layout.site / ZIG
    if not zig.is_file() or not os.access(zig, os.X_OK):
        raise AssembleError(
            f"the bundle has no C toolchain: site-packages/{ZIG} is missing (Triton compiles C at first GPU use)",
            "lock again: recipes/components.toml [toolchain] c pins ziglang, which the lock adds to the wheels",
        )


def root_stage(
    app: StageResult,
    minor: str,
    attention: AttentionRule,
    server: ServerRule,
    vllm_version: str,
    target: str,
    template_digest: str,
    build_dir: Path,
    vllm_build: str = "rocm",
    defaults: Mapping[str, str] | None = None,
    *,
    out: Path,
    force: bool = False,
    zig_target: str,
) -> StageResult:
    """``vllm_build``: how vLLM was built (rocm, python-only, prebuilt), stated in the launcher;
    ``defaults``: the variables the launcher sets unless the caller has (launcher.toml); ``zig_target``:
    what the C compiler wrapper (``CC``) builds for (toolchain.zig_target)."""
    inputs = {
        "app": app.key,
        "zig_target": zig_target,
        "vllm_build": vllm_build,
        "defaults": dict(defaults or {}),
        "template": template_digest,
        "attention": attention.__dict__.__repr__(),
        "server": list(server.command),
        "vllm": vllm_version,
        "target": target,
    }

    def build(tmp: Path) -> Mapping[str, Any]:
        link_tree(app.path, tmp)
        layout = Layout(tmp, minor)
        require_toolchain(layout)
        write_wrapper(tmp, render_wrapper(minor, zig_target))
        text = render_launcher(
            python_minor=minor,
            library_dirs=library_dirs(layout),
            attention=attention,
            vllm_version=vllm_version,
            target=target,
            server=server,
            vllm_build=vllm_build,
            defaults=defaults,
        )
        launcher = tmp / "bin" / "vllm-server"
        launcher.write_text(text)
        launcher.chmod(0o755)
        for name, content in runtime_files().items():
            (layout.site / name).parent.mkdir(exist_ok=True)
            (layout.site / name).write_text(content)
        check_no_build_paths(tmp / "bin", build_dir)
        check_no_build_paths(tmp / "libexec", build_dir)
        return {"launcher": "bin/vllm-server", "cc": WRAPPER}

    return run_stage(out, "root", STAGE_VERSION, inputs, build, force=force)
