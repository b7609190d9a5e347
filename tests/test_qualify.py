"""Tier 0 qualification: passes on the fixture bundle, fails naming the cause on each planted defect."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from collections.abc import Callable, Mapping
from contextlib import suppress
from importlib import resources
from pathlib import Path

import psutil
import pytest
import zstandard

from tests.code_objects import offload_bundle
from tests.conftest import REPO, assert_one_line_error, bundle_cli, run_cli
from tests.upstream.fixture import PYTHON_MINOR, ROCM_VERSION
from tests.upstream.packaging_fixtures import needing_version
from tests.upstream.registry import RegistryServer
from vllm_bundle.errors import RecipeError
from vllm_bundle.qualify.bounded import run_bounded
from vllm_bundle.qualify.tier0 import check_device_code, manylinux_libraries
from vllm_bundle.recipes import load_recipes
from vllm_bundle.tree.layout import Layout
from vllm_bundle.tree.records import read_record, refresh_records, verify_records
from vllm_bundle.tree.vllm_extensions import extension_problems
from vllm_bundle.util.elf import set_runpath

SITE = f"lib/python{PYTHON_MINOR}/site-packages"


@pytest.fixture
def bundle(built: Path, tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    shutil.copytree(built / "gfx1151" / "root", root, symlinks=True)
    return root


def qualify(path: Path, tmp_path: Path, locked: Path, *extra: str):  # type: ignore[no-untyped-def]
    return run_cli("qualify", path, "--recipes", locked, "--report", tmp_path / "report.json", *extra, timeout=300)


def _site_with_record(site: Path, rows: list[str]) -> None:
    info = site / "demo-1.0.dist-info"
    info.mkdir(parents=True)
    (site / "demo.py").write_bytes(b"print('demo')\n")
    (info / "RECORD").write_text("\n".join([*rows, "demo-1.0.dist-info/RECORD,,"]) + "\n")


def _digest(algorithm: str, data: bytes) -> str:
    return f"{algorithm}=" + base64.urlsafe_b64encode(hashlib.new(algorithm, data).digest()).rstrip(b"=").decode()


@pytest.mark.parametrize("algorithm", ["sha256", "sha384", "sha512"])
def test_records_any_hash_algorithm(tmp_path: Path, algorithm: str) -> None:
    """A RECORD row may use any hashlib algorithm (PEP 376): a true sha384/sha512 row verifies, a wrong
    one is named, and refreshing an edited file re-hashes it with the row's own algorithm."""
    data = b"print('demo')\n"
    good, bad = tmp_path / "good", tmp_path / "bad"
    _site_with_record(good, [f"demo.py,{_digest(algorithm, data)},{len(data)}"])
    _site_with_record(bad, [f"demo.py,{_digest(algorithm, data + b'!')},{len(data)}"])
    assert verify_records(good) == []
    assert verify_records(bad) == ["demo-1.0.dist-info: demo.py does not match its RECORD hash"]
    (good / "demo.py").write_bytes(b"print('edit')\n")
    assert refresh_records(good, {good / "demo.py"}) == 1
    entry = read_record(good / "demo-1.0.dist-info/RECORD")[0]
    assert entry.hash_ is not None and str(entry.hash_) == _digest(algorithm, b"print('edit')\n")
    assert verify_records(good) == []


def test_records_malformed_row_is_named(tmp_path: Path) -> None:
    _site_with_record(tmp_path, ["demo.py,nosuchhash=abc,14"])
    assert verify_records(tmp_path) == ["demo-1.0.dist-info/RECORD: invalid hash algorithm 'nosuchhash'"]


@pytest.mark.parametrize("platform", ["x86_64-manylinux_2_35", "x86_64-manylinux_2_28", "x86_64-manylinux2014"])
def test_manylinux_libraries_are_auditwheels_policy(platform: str) -> None:
    """The system libraries a bundle may take are auditwheel's manylinux whitelist for the platform: the
    same set as the policy JSON's ``lib_whitelist`` (name or alias), with glibc and libstdc++, not HIP."""
    tag = platform.partition("-")[2]
    data = json.loads(resources.files("auditwheel.policy").joinpath("manylinux-policy.json").read_text())
    listed = next(p["lib_whitelist"] for p in data if tag == p["name"] or tag in p["aliases"])
    allowed = manylinux_libraries(platform)
    assert allowed == frozenset(listed)
    assert {"libc.so.6", "libstdc++.so.6", "libm.so.6"} <= allowed
    assert not {"libamdhip64.so", "libamdhip64.so.7", "libcudart.so.13"} & allowed


@pytest.mark.parametrize("platform", ["x86_64-manylinux_9_99", "nosucharch-manylinux_2_35"])
def test_manylinux_libraries_unknown_policy(platform: str) -> None:
    with pytest.raises(RecipeError, match="auditwheel knows no policy"):
        manylinux_libraries(platform)


def test_fixture_bundle_passes(bundle: Path, tmp_path: Path, locked: Path) -> None:
    result = qualify(bundle, tmp_path, locked)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["passed"] and report["target"] == "gfx1151"
    assert {c["name"] for c in report["checks"]} == {
        "elf-closure",
        "symbol-versions",
        "search-paths",
        "torch-abi",
        "torch-requirement",
        "records",
        "device-code",
        "vllm-device-code",
        "no-cuda",
        "symlinks",
        "launcher",
        "runtime",
        "rocm-runtime",
        "c-toolchain",
        "build-paths",
        "size",
        "triton-kernels",
        "relocated-smoke",
    }
    assert "PASSED" in result.stdout
    # The fixture's CPython is this machine's (glibc 2.36): its floor is what it claims (FIXTURE_PLATFORM)
    assert report["floor"]["platform"] == "manylinux_2_36_x86_64" and report["floor"]["glibc"] == "2.36"
    assert report["floor"]["highest"]["GLIBC"] == "2.36"


def test_archive_parts_pass(built: Path, tmp_path: Path, locked: Path) -> None:
    parts = built.parent / "bundles" / f"vllm0.33.0-rocm{ROCM_VERSION}-gfx1151"
    result = qualify(parts, tmp_path, locked)
    assert result.returncode == 0, result.stdout + result.stderr


def test_qualification_ran_inside_the_bundle_build(built: Path) -> None:
    report = json.loads((built / "gfx1151" / "qualify" / "qualification.json").read_text())
    assert report["passed"]


def _compile_extension(path: Path, symbol: str) -> None:
    source = path.with_suffix(".c")
    source.write_text(f"extern int {symbol};\nint use(void) {{ return {symbol}; }}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(source)], check=True)
    source.unlink()


def _triton_kernels_of_another_triton(root: Path) -> None:
    """vLLM 0.33.0 pins triton_kernels of Triton's 3.8 branch (cmake/external_projects/triton_kernels.cmake),
    whose target_info imports is_hip_gfx1250 (triton-lang/triton python/triton_kernels/triton_kernels/
    target_info.py), a name the bundle's Triton 3.7.1 does not have (PyPI triton-3.7.1
    triton/language/target_info.py)."""
    module = root / SITE / "vllm" / "third_party" / "triton_kernels" / "target_info.py"
    assert module.is_file(), "premise: the bundle's vLLM has triton_kernels"
    module.write_text(module.read_text().replace("is_hip_cdna4)", "is_hip_cdna4, is_hip_gfx1250)"))


def _drop_comgr(root: Path) -> None:
    (root / SITE / "_rocm_sdk_core/lib/libamd_comgr.so.3").unlink()


def _drop_kpack(root: Path) -> None:
    (root / SITE / "_rocm_sdk_libraries/.kpack/blas_lib_gfx1151.kpack").unlink()


def _edit_torch(root: Path) -> None:
    """Same-size tampering, so only the hash (not the size) can catch it."""
    target = root / SITE / "torch/__init__.py"
    content = target.read_bytes()
    target.write_bytes(content[:-2] + b"#\n")


def _stock_rocm_sdk(root: Path) -> None:
    """TheRock's rocm_sdk as published (RTLD_GLOBAL preloads), its RECORD made to agree: only the fix is
    missing, not a hash."""
    site = root / SITE
    subprocess.run(
        ["patch", "-p1", "-R", "-s", "-d", str(site), "-i", str(REPO / "patches/rocm-sdk/rtld-local.patch")], check=True
    )
    refresh_records(site, {site / "rocm_sdk/__init__.py"})


def _second_hip_runtime(root: Path) -> None:
    """A second HIP runtime beside the SDK's, as a torch wheel bundling its own would bring."""
    hip = root / SITE / "_rocm_sdk_core/lib/libamdhip64.so.7"
    shutil.copyfile(hip.resolve(), root / SITE / "torch/lib/libamdhip64.so.7")


def _absolute_rpath(root: Path) -> None:
    set_runpath(root / SITE / "torch/lib/libtorch_hip.so", ["/home/builder/build/gfx1151/site/lib"])


def _break_launcher(root: Path) -> None:
    launcher = root / "bin" / "vllm-server"
    launcher.write_text(launcher.read_text().replace("esac\n    done", "esac\n    don"))


def _no_runtime_hook(root: Path) -> None:
    """A site-packages without the line that ties the server's children to it (issue #22)."""
    (root / SITE / "vllm-bundle-runtime.pth").unlink()


def _no_zig(root: Path) -> None:
    """The C compiler Triton runs at first GPU use, gone (issue #22)."""
    (root / SITE / "ziglang" / "zig").unlink()


def _torch_mismatch(root: Path) -> None:
    """A requirement among METADATA's headers (setuptools writes the README as its body after them)."""
    (metadata,) = (root / SITE).glob("vllm-*.dist-info/METADATA")
    headers, blank, body = metadata.read_text().partition("\n\n")
    metadata.write_text(headers + "\nRequires-Dist: torch==2.9.0" + blank + body)


def _cuda_library(root: Path) -> None:
    """What PyPI's torchvision 0.27.0 (a CUDA 13 build) would bring along."""
    libs = root / SITE / "torchvision.libs"
    libs.mkdir()
    (libs / "libcudart.faf08d9a.so.13").write_bytes(b"\x7fELF")


def _cudnn(root: Path) -> None:
    """What an nvidia-cudnn wheel's files would be, without its distribution."""
    libs = root / SITE / "nvidia" / "cudnn" / "lib"
    libs.mkdir(parents=True)
    (libs / "libcudnn_ops.so.9").write_bytes(b"\x7fELF")


def _newer_glibc(root: Path) -> None:
    """A library built on a newer system than the bundle claims: strlcpy is glibc 2.38's (issue #50)."""
    needing_version(root / "lib" / "libnewsym.so", "strlcpy", "libc.so.6", "GLIBC_2.38")


def _undefined_torch_symbol(root: Path) -> None:
    _compile_extension(root / SITE / "vllm/_C.abi3.so", "_ZN3c1019UndefinedTensorImpl10_singletonE")


@pytest.mark.parametrize(
    ("defect", "check", "cause"),
    [
        (_drop_comgr, "elf-closure", "libamdhip64.so.7 needs libamd_comgr.so.3"),
        (
            _newer_glibc,
            "symbol-versions",
            "lib/libnewsym.so needs strlcpy@GLIBC_2.38 (libc.so.6): above the floor manylinux_2_36_x86_64 "
            "(GLIBC <= 2.36)",
        ),
        (_drop_kpack, "records", "_rocm_sdk_libraries/.kpack/blas_lib_gfx1151.kpack, which is missing"),
        (_edit_torch, "records", "torch/__init__.py does not match its RECORD hash"),
        (_absolute_rpath, "search-paths", "absolute RPATH/RUNPATH /home/builder/build/gfx1151/site/lib"),
        (
            _stock_rocm_sdk,
            "rocm-runtime",
            f"rocm_sdk/__init__.py lacks the fix rtld-local (rtld-local.patch), which ROCm {ROCM_VERSION}",
        ),
        (_second_hip_runtime, "rocm-runtime", "libamdhip64.so.7 is shipped 2 times"),
        (_break_launcher, "launcher", "bin/vllm-server is not valid sh"),
        (_no_runtime_hook, "runtime", "site-packages/vllm-bundle-runtime.pth is missing"),
        (_no_zig, "c-toolchain", f"{SITE}/ziglang/zig, which libexec/vllm-bundle/cc runs, is missing"),
        (_torch_mismatch, "torch-requirement", "vLLM requires torch==2.9.0, the bundle has torch 2.13.0+rocm"),
        (_undefined_torch_symbol, "torch-abi", "needs _ZN3c1019UndefinedTensorImpl10_singletonE"),
        (_cuda_library, "no-cuda", "torchvision.libs/libcudart.faf08d9a.so.13 is a CUDA library"),
        (_cudnn, "no-cuda", "nvidia/cudnn/lib/libcudnn_ops.so.9 is a CUDA library"),
        (
            _triton_kernels_of_another_triton,
            "triton-kernels",
            "triton_kernels.target_info: ImportError: cannot import name 'is_hip_gfx1250'",
        ),
    ],
)
def test_planted_defect_is_named(
    bundle: Path, tmp_path: Path, locked: Path, defect: Callable[[Path], None], check: str, cause: str
) -> None:
    defect(bundle)
    result = qualify(bundle, tmp_path, locked)
    assert_one_line_error(result, "tier 0 qualification failed", "--warn-only")
    report = json.loads((tmp_path / "report.json").read_text())
    failed = {c["name"]: c["problems"] for c in report["checks"] if not c["passed"]}
    assert check in failed, failed
    assert any(cause in problem for problem in failed[check]), failed[check]
    assert f"FAIL {check}" in result.stdout


def test_warn_only_reports_a_failed_check_and_exits_zero(bundle: Path, tmp_path: Path, locked: Path) -> None:
    """``--warn-only`` changes the exit code alone: the report and the output name the failed check as
    without it. (Once here: each planted defect above is a check's failure reported the same way.)"""
    _drop_comgr(bundle)
    result = qualify(bundle, tmp_path, locked, "--warn-only")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    failed = {c["name"]: c["problems"] for c in report["checks"] if not c["passed"]}
    assert any("libamdhip64.so.7 needs libamd_comgr.so.3" in problem for problem in failed["elf-closure"]), failed
    assert "FAIL elf-closure" in result.stdout


def test_a_failing_bundle_is_not_archived(  # type: ignore[no-untyped-def]
    locked: Path, built: Path, tmp_path: Path, upstream, builder_registry: RegistryServer
) -> None:
    """The bundle pipeline stops before the release assets when tier 0 fails."""
    build = tmp_path / "build"
    shutil.copytree(built, build, symlinks=True)
    launcher = build / "gfx1151" / "root" / "bin" / "vllm-server"
    launcher.unlink()
    launcher.write_text("#!/bin/sh\nif then\n")
    stamp = build / "gfx1151" / ".root.stage.json"
    assert stamp.exists()
    # The root stage is cached (its stamp still matches), so qualification is forced to look again.
    result = bundle_cli(locked, upstream, build, built.parent / "cache", "--force", "qualify", builder=builder_registry)
    assert_one_line_error(result, "tier 0 qualification failed", "launcher")
    assert not (tmp_path / "bundles").exists()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('system-libraries = "libc.so.6"', "system-libraries"),
        ("system-library-dirs = [1, 2]", "system-library-dirs"),
        ("smoke-imports = []", "smoke-imports"),
    ],
)
def test_qualify_rules_are_type_checked(bundle: Path, locked: Path, tmp_path: Path, text: str, key: str) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(locked, recipes)
    rules = recipes / "qualify.toml"
    kept, skipping = [], False  # every line but the key's (its value may span lines), then the bad one
    for line in rules.read_text().splitlines():
        if line.startswith(f"{key} ="):
            skipping = not line.rstrip().endswith("]")
            continue
        if skipping:
            skipping = not line.startswith("]")
            continue
        kept.append(line)
    rules.write_text("\n".join([*kept, text]) + "\n")
    result = run_cli("qualify", bundle, "--recipes", recipes, "--report", tmp_path / "r.json")
    assert_one_line_error(result, f"qualify.toml: {key}")


# -- vLLM's own kernels exist for every ISA of the target -------------------------------------------------


def _offload_bundle(code_objects: Mapping[str, bytes], isas: list[str]) -> bytes:
    """A clang offload bundle of the real code objects of ``isas`` (tests/code_objects.py)."""
    return offload_bundle({isa: code_objects[isa] for isa in isas})


def _compressed(bundle: bytes) -> bytes:
    """What --offload-compress writes (format version 2, zstd)."""
    payload = zstandard.ZstdCompressor().compress(bundle)
    return b"CCOB" + struct.pack("<HHIIQ", 2, 1, 24 + len(payload), len(bundle), 0) + payload


def _extension_with_fatbin(path: Path, fatbin: bytes) -> None:
    source = path.with_suffix(".c")
    data = ", ".join(str(b) for b in fatbin)
    source.write_text(
        f'__attribute__((section(".hip_fatbin"), used)) const unsigned char fatbin[] = {{{data}}};\n'
        "int vllm_kernel_stub(void) { return 0; }\n"
    )
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(source)], check=True)
    source.unlink()


def _rerecord(root: Path, *changed: Path) -> None:
    """The RECORD files made to match (what a re-packaged wheel would carry): only the kernels differ."""
    refresh_records(root / SITE, set(changed))


def test_vllm_extensions_must_carry_code_for_each_isa(
    bundle: Path, tmp_path: Path, locked: Path, code_objects: dict[str, bytes]
) -> None:
    extension = bundle / SITE / "vllm" / "_C.abi3.so"
    _extension_with_fatbin(extension, _offload_bundle(code_objects, ["gfx1100", "gfx1101"]))
    _rerecord(bundle, extension)
    result = qualify(bundle, tmp_path, locked, "--target", "gfx1151")
    assert_one_line_error(result, "vllm-device-code", "vllm/_C.abi3.so has no code objects for gfx1151")
    _extension_with_fatbin(extension, _compressed(_offload_bundle(code_objects, ["gfx1100", "gfx1151"])))
    _rerecord(bundle, extension)
    passed = qualify(bundle, tmp_path, locked, "--target", "gfx1151")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    (check,) = [c for c in report["checks"] if c["name"] == "vllm-device-code"]
    assert check["passed"] and "7 vLLM extensions present; 4 carry code for gfx1151" in check["summary"]


RECIPES = load_recipes(Path(__file__).resolve().parents[1] / "recipes")
RULE_0_33 = RECIPES.vllm.extension_rule("0.33.0")


def _extensions(where: Path, code_objects: Mapping[str, bytes], isas: Mapping[str, list[str]]) -> dict[str, Path]:
    """vLLM 0.33.0's native extensions in ``where``: each HIP one with the code objects of ``isas[name]``."""
    where.mkdir(parents=True, exist_ok=True)
    found = {}
    for name in RULE_0_33.names:
        found[name] = where / f"{name}.abi3.so"
        fatbin = _offload_bundle(code_objects, isas[name]) if name in RULE_0_33.device_code else b""
        _extension_with_fatbin(found[name], fatbin)
    return found


@pytest.mark.parametrize("target", sorted(RECIPES.targets))
def test_each_hip_extension_must_carry_code_for_every_isa_of_its_target(
    target: str, code_objects: dict[str, bytes], tmp_path: Path
) -> None:
    """What vLLM 0.33.0 builds per ISA (test_upstream_facts.py reads its CMakeLists.txt): every HIP
    extension is compiled for every ISA of the build, CDNA and RDNA alike, and the ISA-gated kernels
    (Octave KV for gfx942/gfx1100, fused KDA for gfx942/gfx950) are sources inside those extensions, not
    extensions of their own. So a bundle lacking one ISA of its target in one extension fails, naming
    both, on every target; and nothing of another family is asked for (a gfx942 bundle carries no RDNA
    code, an RDNA one no CDNA code, and both pass)."""
    isas = list(RECIPES.targets[target].isas)
    whole = _extensions(tmp_path / "whole", code_objects, dict.fromkeys(RULE_0_33.device_code, isas))
    assert extension_problems(whole, RULE_0_33, isas)[0] == []
    for lost in isas:
        name = RULE_0_33.device_code[isas.index(lost) % len(RULE_0_33.device_code)]
        kept = [isa for isa in isas if isa != lost]
        carried = {**dict.fromkeys(RULE_0_33.device_code, isas), name: kept}
        found = _extensions(tmp_path / f"without-{lost}", code_objects, carried)
        problems, _ = extension_problems(found, RULE_0_33, isas)
        has = ", ".join(sorted(kept)) or "none"
        assert problems == [f"vllm/{name}.abi3.so has no code objects for {lost} (it has {has})"]


def _device_code_problems(site: Path, target: str) -> list[str]:
    layout = Layout(site.parents[2], PYTHON_MINOR)
    assert layout.site == site
    return check_device_code(layout, RECIPES.targets[target]).problems


@pytest.mark.parametrize("target", sorted(RECIPES.targets))
def test_the_sdks_and_torchs_device_code_is_found_split_or_inside_their_libraries(
    target: str, code_objects: dict[str, bytes], tmp_path: Path
) -> None:
    """The ROCm SDK and torch each carry code for every ISA of the target: as kpack archives named for it
    (what a multi-arch index's device packages install) or as code objects in their libraries' fat
    binaries (a per-family index's wheels, tests/upstream/therock.py ``_per_family_sdk``). A bundle without
    one ISA's code in one of them fails naming both; a kpack or a code object of another ISA does not count."""
    isas = list(RECIPES.targets[target].isas)
    split = tmp_path / "split" / SITE
    for home, stem in (("_rocm_sdk_libraries", "blas_lib"), ("torch", "torch")):
        (split / home / ".kpack").mkdir(parents=True)
        for isa in isas:
            (split / home / ".kpack" / f"{stem}_{isa}.kpack").write_bytes(b"kpack")
    assert _device_code_problems(split, target) == []
    lost = isas[-1]
    (split / "torch" / ".kpack" / f"torch_{lost}.kpack").rename(split / "torch" / ".kpack" / "torch_gfx9000.kpack")
    assert _device_code_problems(split, target) == [f"no device code for {lost} in torch (no .kpack, no code object)"]

    family = tmp_path / "family" / SITE
    libraries = family / f"_rocm_sdk_libraries_{RECIPES.targets[target].legacy_family.replace('-', '_')}" / "lib"
    (family / "torch" / "lib").mkdir(parents=True)
    libraries.mkdir(parents=True)
    _extension_with_fatbin(libraries / "librocblas.so.5", _offload_bundle(code_objects, isas))
    torch = family / "torch" / "lib" / "libtorch_hip.so"
    _extension_with_fatbin(torch, _compressed(_offload_bundle(code_objects, isas)))
    assert _device_code_problems(family, target) == []
    other = "gfx942" if lost != "gfx942" else "gfx1151"
    _extension_with_fatbin(torch, _compressed(_offload_bundle(code_objects, [*isas[:-1], other])))
    assert _device_code_problems(family, target) == [f"no device code for {lost} in torch (no .kpack, no code object)"]
    (libraries / "librocblas.so.5").unlink()
    assert _device_code_problems(family, target) == [
        *(f"no device code for {isa} in the ROCm SDK's libraries (no .kpack, no code object)" for isa in isas),
        f"no device code for {lost} in torch (no .kpack, no code object)",
    ]


def _drop_extension(root: Path) -> None:
    (root / SITE / "vllm" / "_rocm_C.abi3.so").unlink()
    _rerecord(root)


def _python_only(root: Path) -> None:
    """A vLLM without its native code, in a bundle whose launcher says it was built for ROCm."""
    for extension in (root / SITE / "vllm").glob("*.so"):
        extension.unlink()
    _rerecord(root)


@pytest.mark.parametrize(
    ("defect", "cause"),
    [
        (_drop_extension, "vllm/_rocm_C (a native extension of a ROCm build) is missing"),
        (_python_only, "vllm/_C (a native extension of a ROCm build) is missing"),
    ],
)
def test_a_rocm_bundle_without_vllms_kernels_fails(
    bundle: Path, tmp_path: Path, locked: Path, defect: Callable[[Path], None], cause: str
) -> None:
    defect(bundle)
    result = qualify(bundle, tmp_path, locked)
    assert_one_line_error(result, "tier 0 qualification failed", "vllm-device-code", cause)


def test_a_python_only_bundle_passes_only_when_its_launcher_says_so(bundle: Path, tmp_path: Path, locked: Path) -> None:
    _python_only(bundle)
    launcher = bundle / "bin" / "vllm-server"
    launcher.write_text(launcher.read_text().replace("# vLLM build: rocm", "# vLLM build: python-only"))
    result = qualify(bundle, tmp_path, locked, "--warn-only")
    report = json.loads((tmp_path / "report.json").read_text())
    (check,) = [c for c in report["checks"] if c["name"] == "vllm-device-code"]
    assert check["passed"] and "Python-only vLLM, built on request" in check["summary"], result.stdout


def test_a_vllm_version_without_an_extension_rule_fails(bundle: Path, tmp_path: Path, locked: Path) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(locked, recipes)
    components = recipes / "components.toml"
    components.write_text(components.read_text().replace('versions = ">=0.33,<0.34"', 'versions = ">=0.34"'))
    result = qualify(bundle, tmp_path, recipes)
    assert_one_line_error(
        result, "vllm-device-code", "no [[vllm.extensions]] entry in components.toml covers vLLM 0.33.0"
    )


def test_gfx950_code_objects_from_a_real_compiler_are_read_like_any_other(
    bundle: Path, tmp_path: Path, locked: Path, code_objects: dict[str, bytes]
) -> None:
    """gfx950 (CDNA4), whose code Debian's clang-19 cannot make: tier 0 reads real gfx950 code objects (the
    real ziglang's clang, LLVM 22), plain and compressed, all the same (test_targets.py builds a gfx950
    bundle with the same compiler)."""
    for name, fatbin in (
        ("_C", _offload_bundle(code_objects, ["gfx950"])),
        ("_C_stable_libtorch", _compressed(_offload_bundle(code_objects, ["gfx942", "gfx950"]))),
        ("_moe_C_stable_libtorch", _offload_bundle(code_objects, ["gfx950"])),
        ("_rocm_C", _compressed(_offload_bundle(code_objects, ["gfx950"]))),
    ):
        _extension_with_fatbin(bundle / SITE / "vllm" / f"{name}.abi3.so", fatbin)
    _rerecord(bundle, *(bundle / SITE / "vllm").glob("*.so"))
    qualify(bundle, tmp_path, locked, "--target", "gfx950", "--warn-only")
    report = json.loads((tmp_path / "report.json").read_text())
    (check,) = [c for c in report["checks"] if c["name"] == "vllm-device-code"]
    assert check["passed"] and "4 carry code for gfx950" in check["summary"], check


# -- the bundle's own code, run with a bound that holds (issue #51, F4) -----------------------------------

KERNELS = f"{SITE}/vllm/third_party/triton_kernels"
BOUND_S = 5  # tier 0's bound on the bundle's python (IMPORT_TIMEOUT_S), made short for these tests
#: `vllm-bundle` as a user runs it (its own process: its exit code and stderr as they are), the bound shortened.
BOUNDED_CLI = f"""import sys
import vllm_bundle.qualify.tier0 as tier0
tier0.IMPORT_TIMEOUT_S = {BOUND_S}
from vllm_bundle.cli import main
sys.exit(main(sys.argv[1:]))
"""
#: triton_kernels modules that never let the import end: one that hangs; one whose forked child holds the
#: interpreter's stdout (and sleeps) after the interpreter itself is done. Each notes the pid that lingers.
HANGS = """import os, time
with open({pids!r}, "a") as f:
    f.write(f"{{os.getpid()}}\\n")
time.sleep(3600)
"""
FORKS = """import os, time
child = os.fork()
if child == 0:
    time.sleep(3600)
    os._exit(0)
with open({pids!r}, "a") as f:
    f.write(f"{{child}}\\n")
"""


def _alive_then_killed(pids: Path) -> list[int]:
    """The planted processes still running; each is then killed (a qualify that does not kill them leaves
    them behind, and the next test must not find them)."""
    alive = [pid for pid in map(int, pids.read_text().split()) if _running(pid)] if pids.exists() else []
    for pid in alive:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return alive


@pytest.mark.parametrize(
    ("module", "cause"),
    [
        (HANGS, f"the bundle's python did not finish importing vLLM's triton_kernels within {BOUND_S} s (killed)"),
        (FORKS, "the bundle's python left 1 process running after importing vLLM's triton_kernels (killed)"),
    ],
    ids=["hangs", "forks-a-child-holding-stdout"],
)
def test_a_triton_kernels_module_that_does_not_end_is_killed_and_named(
    bundle: Path, tmp_path: Path, locked: Path, module: str, cause: str
) -> None:
    pids = tmp_path / "pids"
    (bundle / KERNELS / "lingers.py").write_text(module.format(pids=str(pids)))
    command = [sys.executable, "-c", BOUNDED_CLI, "qualify", str(bundle), "--recipes", str(locked)]
    try:
        result = subprocess.run(
            [*command, "--report", str(tmp_path / "report.json")],
            capture_output=True,
            text=True,
            timeout=120,  # before the fix: silent for 600 s, then a traceback
        )
    finally:
        alive = _alive_then_killed(pids)
    assert_one_line_error(result, "tier 0 qualification failed (1 of", f"triton-kernels: {cause}")
    assert pids.read_text().split(), "premise: the planted module ran"
    assert alive == [], "no process of the planted module outlives qualify"


# The mechanism alone (qualify/bounded.py), on this machine's python: no bundle needed.
PRINTS_THEN_HANGS = (
    "import sys, time; print('started', flush=True); print('to stderr', file=sys.stderr); time.sleep(60)"
)
#: Each says its pid and its child's, which stays (and sleeps) when it ends.
FORKS_THEN_ENDS = """import os, time
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
print(os.getpid(), child, flush=True)
"""
HANGS_WITH_A_CHILD = f"{FORKS_THEN_ENDS}\ntime.sleep(60)"


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that runs (a zombie does not: it has ended, and waits to be reaped by
    its parent, or by init when its parent is gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(30)
def test_bounded_returns_what_the_command_wrote() -> None:
    result = run_bounded([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], env={}, timeout=20)
    assert (result.returncode, result.stdout, result.stderr, result.left_running) == (3, "out\n", "", 0)


@pytest.mark.timeout(30)
def test_bounded_kills_a_command_that_does_not_end_and_keeps_what_it_wrote() -> None:
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        run_bounded([sys.executable, "-c", PRINTS_THEN_HANGS], env={}, timeout=2)
    said = (raised.value.timeout, raised.value.output, str(raised.value.stderr))  # typeshed: stderr is bytes
    assert said == (2, "started\n", "to stderr\n"), "what it wrote before it was killed is kept"


def _left_running(command: str, timeout: float) -> int:
    """Run ``command`` bounded: neither it nor its child runs once run_bounded is done; the number of its
    processes run_bounded found running after it ended (-1: it did not end)."""
    try:
        result = run_bounded([sys.executable, "-c", command], env={}, timeout=timeout)
    except subprocess.TimeoutExpired as timed_out:
        said, left = str(timed_out.output), -1
    else:
        said, left = result.stdout, result.left_running
    assert [pid for pid in map(int, said.split()) if _running(pid)] == []
    return left


@pytest.mark.timeout(30)  # before: subprocess.run waited for the pipe the child holds, 60 s
def test_bounded_kills_a_child_left_running_when_the_command_ends() -> None:
    assert _left_running(FORKS_THEN_ENDS, timeout=20) == 1, "the child left running is counted"


@pytest.mark.timeout(30)
def test_bounded_kills_the_children_of_a_command_that_does_not_end() -> None:
    assert _left_running(HANGS_WITH_A_CHILD, timeout=2) == -1, "it did not end: TimeoutExpired"


@pytest.mark.parametrize("over", [0, 1])
def test_the_size_budget_is_lemonades_tar_limit_at_the_measured_rate_and_margin(over: int, tmp_path: Path) -> None:
    """Lemonade's tar -tf and tar -xf each have 300 s (archive_platform.h:10): at 80 MB/s with a margin of
    2 a bundle may hold 12.0 GB. A tree of exactly that passes; one byte more fails, naming the derivation.
    (A sparse file: its apparent size is what tar writes out.)"""
    from vllm_bundle.qualify.tier0 import check_size

    target = load_recipes(REPO / "recipes").target("gfx1151")
    budget = target.size_budget
    assert (budget.time_limit_s, budget.extract_rate_mb_s, budget.margin) == (300, 80, 2)
    assert budget.bytes == 12_000_000_000, "300 s x 80 MB/s / 2"
    with (tmp_path / "blob").open("wb") as blob:
        blob.truncate(budget.bytes + over)
    result = check_size(Layout(tmp_path, PYTHON_MINOR), target)
    assert result.passed is (over == 0), result
    if over:
        (problem,) = result.problems
        assert "over its 11.18 GiB budget (Lemonade's 300 s tar limit at 80 MB/s, margin 2x)" in problem
