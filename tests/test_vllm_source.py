"""The patch series on real vLLM source releases from PyPI, and the Python-only wheel build."""

from __future__ import annotations

import hashlib
import os
import py_compile
import re
import shutil
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.version import Version

from tests.conftest import OLD_VLLM, REPO, TEST_DOWNLOADS, assert_one_line_error, run_cli
from vllm_bundle.errors import PatchError
from vllm_bundle.recipes import load_recipes
from vllm_bundle.tree.patches import apply_series, read_series
from vllm_bundle.tree.vllm_source import extract_sdist, outcomes_of, prepare_source
from vllm_bundle.util.fsutil import sha256_file

PINNED = load_recipes(REPO / "recipes").vllm.version
PATCHES = REPO / "patches" / "vllm"
ARCHS = re.compile(r'set\(HIP_SUPPORTED_ARCHS "([^"]*)"\)')
PLATFORMS = "vllm/platforms/__init__.py"


def hip_archs(tree: Path) -> list[str]:
    match = ARCHS.search((tree / "CMakeLists.txt").read_text())
    assert match
    return match.group(1).split(";")


def rocm_plugin_source(tree: Path) -> str:
    text = (tree / PLATFORMS).read_text()
    start = text.index("def rocm_platform_plugin")
    return text[start : text.index("\ndef ", start + 1)]


def digest(tree: Path, *names: str) -> str:
    return hashlib.sha256(b"".join((tree / n).read_bytes() for n in names)).hexdigest()


ISAS = load_recipes(REPO / "recipes").all_isas


def prepare(vllm_sdist: Callable[[str], Path], version: str, out: Path, patches: Path = PATCHES):  # type: ignore[no-untyped-def]
    sdist = vllm_sdist(version)
    return prepare_source(sdist, sha256_file(sdist), version, patches, ISAS, out=out)


@pytest.fixture(scope="module")
def old_tree(vllm_sdist: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("old") / "vllm-src"
    prepare(vllm_sdist, OLD_VLLM, out)
    return out


@pytest.fixture(scope="module")
def pinned_stage(vllm_sdist: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return prepare(vllm_sdist, PINNED, tmp_path_factory.mktemp("pinned") / "vllm-src")


def test_older_release_gets_the_rdna_archs_and_the_fallbacks(vllm_sdist: Callable[[str], Path], tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    extract_sdist(vllm_sdist(OLD_VLLM), pristine, OLD_VLLM)
    assert "gfx1151" not in hip_archs(pristine), "premise: this release lacks gfx1151"
    result = prepare(vllm_sdist, OLD_VLLM, tmp_path / "src")
    tree = result.path
    assert {(o.patch_id, o.status) for o in outcomes_of(result)} == {
        ("hip-archs-rdna", "applied"),
        ("amdsmi-fallback", "applied"),
        ("amdsmi-calls", "applied"),
    }
    archs = hip_archs(tree)
    assert set(archs) >= ISAS
    assert set(hip_archs(pristine)) <= set(archs), "nothing upstream listed was dropped"
    plugin = rocm_plugin_source(tree)
    assert "torch.version" in plugin and "torch.cuda.is_available()" in plugin
    for name in (PLATFORMS, "vllm/platforms/rocm.py", "vllm/platforms/_vllm_bundle_amdsmi.py"):
        py_compile.compile(str(tree / name), doraise=True)


def test_pinned_release_reports_archs_already_upstream(pinned_stage) -> None:  # type: ignore[no-untyped-def]
    tree = pinned_stage.path
    assert {(o.patch_id, o.status) for o in outcomes_of(pinned_stage)} == {
        ("hip-archs-rdna", "already upstream"),
        ("amdsmi-fallback", "applied"),
        ("amdsmi-calls", "applied"),
    }
    assert set(hip_archs(tree)) >= ISAS
    plugin = rocm_plugin_source(tree)
    assert "in_wsl()" not in plugin, "the torch fallback no longer depends on WSL"
    assert "if not is_rocm:" in plugin and 'getattr(torch.version, "hip", None)' in plugin
    py_compile.compile(str(tree / PLATFORMS), doraise=True)


def test_a_release_missing_one_target_isa_is_not_already_upstream(
    vllm_sdist: Callable[[str], Path], tmp_path: Path
) -> None:
    """0.14.1 lists gfx1150/gfx1151 but not gfx1102/gfx1103: a check for one name would say "upstream"."""
    result = prepare(vllm_sdist, "0.14.1", tmp_path / "src")
    assert dict((o.patch_id, o.status) for o in outcomes_of(result))["hip-archs-rdna"] == "applied"
    assert {"gfx1102", "gfx1103"} <= set(hip_archs(result.path))


def test_stage_is_skipped_when_nothing_changed(vllm_sdist: Callable[[str], Path], tmp_path: Path) -> None:
    first = prepare(vllm_sdist, OLD_VLLM, tmp_path / "src")
    second = prepare(vllm_sdist, OLD_VLLM, tmp_path / "src")
    assert not first.cached and second.cached
    assert outcomes_of(second) == outcomes_of(first)
    patches = tmp_path / "patches"
    shutil.copytree(PATCHES, patches)
    why = patches / "amdsmi-fallback.v0.10.patch"
    why.write_text(why.read_text().replace("Why: ", "Why: (edited) ", 1))
    third = prepare(vllm_sdist, OLD_VLLM, tmp_path / "src", patches)
    assert not third.cached, "a changed patch redoes the stage"


def test_a_cached_tree_reverted_by_hand_is_patched_again(vllm_sdist: Callable[[str], Path], tmp_path: Path) -> None:
    build = tmp_path / "build"
    args = ("patch", "gfx1151", "--vllm", OLD_VLLM, "--build-dir", build, "--cache-dir", TEST_DOWNLOADS, "--plain")
    assert run_cli(*args).returncode == 0
    tree = build / "gfx1151" / "vllm-src"
    pristine = tmp_path / "pristine"
    extract_sdist(vllm_sdist(OLD_VLLM), pristine, OLD_VLLM)
    shutil.copyfile(pristine / "CMakeLists.txt", tree / "CMakeLists.txt")  # reverted by hand
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    assert "the cached tree had changed: hip-archs-rdna.v0.10.patch is no longer applied" in again.stdout
    assert set(hip_archs(tree)) >= ISAS
    third = run_cli(*args)
    assert "stage  vllm-src (cached)" in third.stdout and "had changed" not in third.stdout


def test_hunk_that_cannot_apply_names_the_differing_line_and_touches_nothing(
    vllm_sdist: Callable[[str], Path], tmp_path: Path
) -> None:
    tree = tmp_path / "src"
    extract_sdist(vllm_sdist(OLD_VLLM), tree, OLD_VLLM)
    platforms = tree / PLATFORMS
    platforms.write_text(
        platforms.read_text().replace(
            'logger.debug("ROCm platform is not available because: %s", str(e))',
            'logger.info("ROCm is not available: %s", e)',
        )
    )
    before = digest(tree, "CMakeLists.txt", PLATFORMS)
    with pytest.raises(PatchError) as caught:
        apply_series(tree, read_series(PATCHES), Version(OLD_VLLM), ISAS)
    message = str(caught.value)
    for part in (
        "amdsmi-fallback.v0.10.patch",
        PLATFORMS,
        "hunk #1",
        "@@ -119,6 +119,18 @@",
        """is 'logger.info("ROCm is not available: %s", e)'""",
        """the patch expects 'logger.debug("ROCm platform is not available because: %s", str(e))'""",
        f"vLLM {OLD_VLLM}",
        "left untouched",
    ):
        assert part in message, (part, message)
    assert digest(tree, "CMakeLists.txt", PLATFORMS) == before, "the CMake patch, applied first, was not kept"


def test_files_the_series_creates_have_the_same_mode_whatever_the_umask(
    vllm_sdist: Callable[[str], Path], tmp_path: Path
) -> None:
    """A wheel records each file's mode: a file a patch creates (GNU patch makes it under the umask) is
    0o644 on every builder, as the release's own files are."""
    previous = os.umask(0o077)
    try:
        result = prepare(vllm_sdist, PINNED, tmp_path / "src")
    finally:
        os.umask(previous)
    created = result.path / "vllm" / "platforms" / "_vllm_bundle_amdsmi.py"
    assert stat.S_IMODE(created.stat().st_mode) == 0o644
    release_mode = stat.S_IMODE((result.path / "vllm" / "__init__.py").stat().st_mode)
    assert stat.S_IMODE((result.path / PLATFORMS).stat().st_mode) == release_mode, "patched files keep theirs"


def test_version_without_a_variant_asks_for_a_port(old_tree: Path) -> None:
    with pytest.raises(PatchError, match=r"no variant of patch hip-archs-rdna covers vLLM 0\.10\.1"):
        apply_series(old_tree.parent / "nowhere", read_series(PATCHES), Version("0.10.1"), ISAS)


def test_a_failed_run_leaves_no_earlier_tree(vllm_sdist: Callable[[str], Path], tmp_path: Path) -> None:
    out = tmp_path / "build" / "gfx1151" / "vllm-src"
    prepare(vllm_sdist, OLD_VLLM, out)
    patches = tmp_path / "patches"
    shutil.copytree(PATCHES, patches)
    broken = patches / "amdsmi-calls.patch"
    broken.write_text(
        broken.read_text().replace(" # the major benefit of using AMDSMI", " # the major benefit of AMDSMI")
    )
    with pytest.raises(PatchError):
        prepare(vllm_sdist, PINNED, out, patches)
    assert not out.exists(), "the 0.11.0 tree is not left where the 0.33.0 one was asked for"
    assert not (out.parent / ".vllm-src.stage.json").exists()


def test_broken_patch_on_the_command_line_is_one_line(vllm_sdist: Callable[[str], Path], tmp_path: Path) -> None:
    vllm_sdist(OLD_VLLM)
    patches = tmp_path / "patches"
    shutil.copytree(PATCHES, patches)
    broken = patches / "hip-archs-rdna.v0.10.patch"
    broken.write_text(
        broken.read_text().replace('-set(HIP_SUPPORTED_ARCHS "gfx906', '-set(HIP_SUPPORTED_ARCHS "gfx900')
    )
    result = run_cli(
        "patch",
        "gfx1151",
        "--vllm",
        OLD_VLLM,
        "--patches",
        patches,
        "--build-dir",
        tmp_path / "build",
        "--cache-dir",
        TEST_DOWNLOADS,
        "--plain",
    )
    assert_one_line_error(result, "hip-archs-rdna.v0.10.patch", "CMakeLists.txt", "hunk #1", f"vLLM {OLD_VLLM}")
    assert not (tmp_path / "build" / "gfx1151" / "vllm-src").exists(), "no half-patched stage output"
    assert not (tmp_path / "build" / "gfx1151" / ".vllm-src.tmp").exists()


def test_python_only_wheel_holds_the_patched_files(
    vllm_sdist: Callable[[str], Path], build_python: Path, tmp_path: Path
) -> None:
    vllm_sdist(PINNED)
    result = run_cli(
        "vllm-wheel",
        "gfx1151",
        "--vllm",
        PINNED,
        "--python",
        build_python,
        "--python-only",
        "--build-dir",
        tmp_path / "build",
        "--cache-dir",
        TEST_DOWNLOADS,
        "--plain",
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(python-only)" in result.stdout
    (wheel,) = (tmp_path / "build" / "gfx1151" / "vllm-wheel").glob("vllm-*.whl")
    assert wheel.name.startswith(f"vllm-{PINNED}+empty-")
    with zipfile.ZipFile(wheel) as archive:
        plugin = archive.read(PLATFORMS).decode()
        metadata = archive.read(f"vllm-{PINNED}+empty.dist-info/METADATA").decode()
    assert "in_wsl()" not in plugin[plugin.index("def rocm_platform_plugin") :].split("\ndef ")[0]
    assert "Requires-Dist: torch" not in metadata, "torch pins removed (TheRock's torch is used)"
    log = tmp_path / "build" / "gfx1151" / "logs" / "vllm-wheel.log"
    assert "removed from" in log.read_text()


def test_the_standalone_wheel_verb_builds_python_only_only_when_asked(tmp_path: Path) -> None:
    result = run_cli("vllm-wheel", "gfx1151", "--vllm", OLD_VLLM, "--build-dir", tmp_path / "build", "--plain")
    assert_one_line_error(result, "vllm-wheel builds a Python-only wheel", "pass --python-only")
    assert not (tmp_path / "build" / "gfx1151" / "vllm-src").exists(), "refused before anything is done"


def test_failed_wheel_build_shows_the_log_tail(vllm_sdist: Callable[[str], Path], tmp_path: Path) -> None:
    """A build interpreter without torch: vLLM's setup.py fails; the tail and the log path are shown."""
    import sys

    vllm_sdist(OLD_VLLM)
    result = run_cli(
        "vllm-wheel",
        "gfx1151",
        "--vllm",
        OLD_VLLM,
        "--python",
        sys.executable,
        "--python-only",
        "--build-dir",
        tmp_path / "build",
        "--cache-dir",
        TEST_DOWNLOADS,
        "--plain",
    )
    last = assert_one_line_error(result, "the vLLM wheel build failed", "vllm-wheel.log", quotes_a_log=True)
    assert "torch" in result.stderr.replace(last, ""), "the log tail shows why"
    assert (tmp_path / "build" / "gfx1151" / "logs" / "vllm-wheel.log").exists()
    assert not (tmp_path / "build" / "gfx1151" / "vllm-wheel").exists()
