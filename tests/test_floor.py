"""Tier 0's floor (qualify/floor.py): every ELF file's symbol versions held against auditwheel's manylinux
policy for ``python.platform``, and the floor measured from them. The files are real shared objects whose
.gnu.version_r names what a newer glibc or libstdc++ would (packaging_fixtures.needing_version)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.upstream.packaging_fixtures import needing_version
from vllm_bundle.qualify.floor import describe, excesses, manylinux_policy, measure
from vllm_bundle.util.elf import DynamicInfo, dynamic_info

PLATFORM = "x86_64-manylinux_2_35"


def _files(*paths: Path) -> dict[Path, DynamicInfo]:
    found = {path: dynamic_info(path) for path in paths}
    return {path: info for path, info in found.items() if info is not None}


def test_a_file_that_needs_a_newer_glibc_is_named_with_its_symbol_and_the_floor(tmp_path: Path) -> None:
    """The issue's example: a shared object calling strlcpy (glibc 2.38), in a bundle that claims 2.35."""
    newsym = needing_version(tmp_path / "lib" / "libnewsym.so", "strlcpy", "libc.so.6", "GLIBC_2.38")
    policy = manylinux_policy(PLATFORM)
    (excess,) = excesses(_files(newsym), policy)
    assert describe(excess, tmp_path, policy) == (
        "lib/libnewsym.so needs strlcpy@GLIBC_2.38 (libc.so.6): above the floor manylinux_2_35_x86_64 (GLIBC <= 2.35)"
    )
    assert excesses(_files(newsym), manylinux_policy("x86_64-manylinux_2_38")) == [], "2.38 allows it"


def test_glibcxx_cxxabi_and_gcc_are_held_to_the_floor_too(tmp_path: Path) -> None:
    """What newer libstdc++ headers emit (GCC 13's std::format: GLIBCXX_3.4.32), and libgcc_s's."""
    files = [
        needing_version(tmp_path / "a.so", "_ZSt20__throw_format_errorPKc", "libstdc++.so.6", "GLIBCXX_3.4.32"),
        needing_version(tmp_path / "b.so", "__cxa_call_terminate", "libstdc++.so.6", "CXXABI_1.3.15"),
        needing_version(tmp_path / "c.so", "__gcc_nested_func_ptr_created", "libgcc_s.so.1", "GCC_14.0.0"),
    ]
    policy = manylinux_policy(PLATFORM)
    problems = [describe(excess, tmp_path, policy) for excess in excesses(_files(*files), policy)]
    assert problems == [
        "a.so needs _ZSt20__throw_format_errorPKc@GLIBCXX_3.4.32 (libstdc++.so.6): above the floor "
        "manylinux_2_35_x86_64 (GLIBCXX <= 3.4.30)",
        "b.so needs __cxa_call_terminate@CXXABI_1.3.15 (libstdc++.so.6): above the floor manylinux_2_35_x86_64 "
        "(CXXABI <= 1.3.13)",
        "c.so needs __gcc_nested_func_ptr_created@GCC_14.0.0 (libgcc_s.so.1): above the floor "
        "manylinux_2_35_x86_64 (GCC <= 12.0.0)",
    ]


def test_a_bundled_librarys_own_versions_are_not_the_systems(tmp_path: Path) -> None:
    """auditwheel holds only the policy's prefixes to it: OPENSSL_3.0.0 is a library the bundle carries."""
    ssl = needing_version(tmp_path / "x.so", "SSL_new", "libssl.so.3", "OPENSSL_3.0.0")
    assert excesses(_files(ssl), manylinux_policy(PLATFORM)) == []
    assert measure(_files(ssl), PLATFORM).highest == {}


def test_the_floor_is_the_oldest_policy_that_allows_every_file(tmp_path: Path) -> None:
    old = needing_version(tmp_path / "old.so", "memcpy", "libc.so.6", "GLIBC_2.14")
    assert measure(_files(old), PLATFORM).to_json() == {
        "platform": "manylinux_2_17_x86_64",  # the first policy whose GLIBC list has 2.14
        "glibc": "2.17",
        "highest": {"GLIBC": "2.14"},
    }
    new = needing_version(tmp_path / "new.so", "__isoc23_strtoull", "libc.so.6", "GLIBC_2.38")
    floor = measure(_files(old, new), PLATFORM)
    assert (floor.platform, floor.glibc, dict(floor.highest)) == ("manylinux_2_38_x86_64", "2.38", {"GLIBC": "2.38"})


def test_a_version_no_manylinux_policy_allows_leaves_no_manylinux_floor(tmp_path: Path) -> None:
    private = needing_version(tmp_path / "p.so", "__libc_dlopen_mode", "libc.so.6", "GLIBC_PRIVATE")
    floor = measure(_files(private), PLATFORM)
    assert (floor.platform, floor.glibc) == ("linux_x86_64", None)


@pytest.mark.parametrize("platform", ["x86_64-manylinux_9_99", "nosucharch-manylinux_2_35"])
def test_an_unknown_policy_is_a_recipe_error(platform: str) -> None:
    from vllm_bundle.errors import RecipeError

    with pytest.raises(RecipeError, match="auditwheel knows no policy"):
        manylinux_policy(platform)


def test_backend_versions_carry_each_tags_glibc_and_merge_them() -> None:
    """Where an installer that reads only backend_versions.json (Lemonade's way) finds the floor: a key of its
    own, which Lemonade's reader ignores (it reads vllm and checksums)."""
    from vllm_bundle.errors import ManifestError
    from vllm_bundle.manifests import backend_versions, check_backend_versions, merge_backend_versions

    sums = {"a.part01-of-01.tar.gz": "0" * 64}
    first = backend_versions("vllm0.33.0-rocm10.0.0-gfx1151", "gfx1151", "o/r", sums, "2.35")
    second = backend_versions("vllm0.33.0-rocm10.0.0-gfx1150", "gfx1150", "o/r", sums, "2.36")
    assert first["glibc"] == {"vllm0.33.0-rocm10.0.0-gfx1151": "2.35"}
    merged = merge_backend_versions([first, second])
    assert merged["glibc"] == {"vllm0.33.0-rocm10.0.0-gfx1150": "2.36", "vllm0.33.0-rocm10.0.0-gfx1151": "2.35"}
    assert "glibc" not in backend_versions("t-gfx1151", "gfx1151", "o/r", sums), "none measured, none said"
    with pytest.raises(ManifestError, match=r"glibc\.t-gfx1151 is '2\.x', not a glibc version"):
        check_backend_versions({**first, "glibc": {"t-gfx1151": "2.x"}}, "f.json")
    other = backend_versions("vllm0.33.0-rocm10.0.0-gfx1151", "gfx1151", "o/r", sums, "2.38")
    with pytest.raises(ManifestError, match=r"needs both glibc 2\.35 and 2\.38"):
        merge_backend_versions([first, other])


def test_an_installer_reads_the_floor_of_either_manifest(tmp_path: Path) -> None:
    import json

    from vllm_bundle.errors import ManifestError
    from vllm_bundle.install.installer import release_from_assets, release_from_pins
    from vllm_bundle.manifests import backend_versions
    from vllm_bundle.util.policy import RetryPolicy

    tag = "vllm0.33.0-rocm10.0.0-gfx1151"
    doc = {
        "tag": tag,
        "target": "gfx1151",
        "archive": {"parts": [{"name": f"{tag}-x64.part01-of-01.tar.gz", "size": 1, "sha256": "0" * 64}]},
        "floor": {"glibc": "2.38", "platform": "manylinux_2_38_x86_64"},
    }
    (tmp_path / "release.json").write_text(json.dumps(doc))
    assert release_from_assets(str(tmp_path), RetryPolicy()).glibc == "2.38"
    (tmp_path / "release.json").write_text(json.dumps({**doc, "floor": {"glibc": "../../x"}}))
    with pytest.raises(ManifestError, match=r"floor\.glibc is '\.\./\.\./x', not a glibc version"):
        release_from_assets(str(tmp_path), RetryPolicy())
    pins = tmp_path / "backend_versions.json"
    pins.write_text(json.dumps(backend_versions(tag, "gfx1151", "o/r", {"p": "0" * 64}, "2.36")))
    assert release_from_pins(pins, "gfx1151", None).glibc == "2.36"


def test_pypis_manylinux_files_pass_the_floor(build_tool_wheels: dict[Path, str], tmp_path: Path) -> None:
    """Real files built in pypa's manylinux images (PyPI's cmake, ninja and markupsafe wheels of vLLM's build
    group): what auditwheel let onto PyPI passes the check auditwheel's policy makes, at the recipes' floor,
    and measures at or below the wheels' own tags. (TheRock's and python-build-standalone's files are on hosts
    this machine cannot reach: the release workflow's tier 0 holds them to the floor at every build.)"""
    import zipfile

    from packaging.utils import parse_wheel_filename

    from vllm_bundle.util.elf import is_elf

    checked = 0
    for wheel in sorted(build_tool_wheels):
        tags = parse_wheel_filename(wheel.name)[3]
        if all(tag.platform == "any" for tag in tags):
            continue
        unpacked = tmp_path / wheel.stem
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(unpacked)
        files = _files(*(p for p in unpacked.rglob("*") if p.is_file() and not p.is_symlink() and is_elf(p)))
        assert files, f"{wheel.name} has ELF files"
        assert excesses(files, manylinux_policy(PLATFORM)) == [], wheel.name
        measured = int(measure(files, PLATFORM).platform.split("_")[2])  # manylinux_2_<minor>_x86_64
        claimed = max(int(tag.platform.split("_")[2]) for tag in tags if tag.platform.startswith("manylinux_2_"))
        assert measured <= claimed, (wheel.name, measured, claimed)
        checked += len(files)
    assert checked >= 3, "cmake's, ninja's and markupsafe's programs and extensions"


def test_a_dynamic_section_under_another_name_is_still_read(tmp_path: Path) -> None:
    """The dynamic section is looked up by its name (one pass over the section headers, shared with the
    symbol versions' lookup); a file whose SHT_DYNAMIC section is named otherwise is read all the same:
    its DT_NEEDED still counts for the closure and the floor."""
    lib = needing_version(tmp_path / "libnewsym.so", "strlcpy", "libc.so.6", "GLIBC_2.38")
    before = dynamic_info(lib)
    assert before is not None and before.needed == ("libc.so.6",), before
    data = lib.read_bytes()
    assert data.count(b".dynamic\0") == 1, "one name in the section-name table"
    lib.write_bytes(data.replace(b".dynamic\0", b".dynamix\0"))
    assert dynamic_info(lib) == before
