"""Tier 0 qualification (no GPU): machine-checked evidence that a bundle is complete and
self-contained, for a bundle tree, an archive or its parts.

Checks: ELF closure (pyelftools: every DT_NEEDED resolves in the bundle or to the system allow-list),
every symbol version at or below the floor ``python.platform`` claims (auditwheel's policy, floor.py), search
paths relative, vLLM's native extensions' torch symbols defined by the bundled libraries,
vLLM's torch requirement met, every RECORD entry present with its hash, device code for every ISA,
launcher, interpreter, the C toolchain Triton runs (``CC``), size budget, and a relocated smoke test:
imports, and a C extension built with the bundle's ``CC`` the way Triton builds one, then loaded.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from vllm_bundle.errors import MalformedRecordError, QualificationError
from vllm_bundle.manifests import dump_json, is_part
from vllm_bundle.paths import default_rocm_fixes
from vllm_bundle.qualify.bounded import run_bounded
from vllm_bundle.qualify.floor import Floor, describe, excesses, manylinux_policy, measure
from vllm_bundle.recipes import ExtensionRule, Table, Target, read_toml
from vllm_bundle.tree.launcher import BUILD_HEADER, PYTHON_ONLY, RUNTIME_PTH, runtime_files
from vllm_bundle.tree.layout import Layout, library_dirs
from vllm_bundle.tree.patches import fixes_not_applied, installed_rocm_version, read_series
from vllm_bundle.tree.records import read_record, records, resolve, verify_records
from vllm_bundle.tree.relocate import dynamic_files, files_mentioning, regular_files
from vllm_bundle.tree.stage import StageResult, run_stage
from vllm_bundle.tree.toolchain import WRAPPER, named_target, named_zig, toolchain_problems
from vllm_bundle.tree.vllm_extensions import extension_problems, find_in_tree
from vllm_bundle.util.elf import DynamicInfo, is_elf
from vllm_bundle.util.extract import symlink_problems
from vllm_bundle.util.fsutil import link_or_copy
from vllm_bundle.util.offload import fatbin_isas
from vllm_bundle.util.parts import extract_parts

QUALIFY_FILE = "qualify.toml"
TORCH_MANGLED = ("_ZN3c10", "_ZNK3c10", "_ZN2at", "_ZNK2at", "_ZN5torch", "_ZNK5torch")
SHOWN = 5  # problems listed per check
#: Bounds on the bundle's own code that tier 0 runs (bounded.py: at one, the command's whole process
#: group is killed and the check fails naming it). Importing torch, Triton and vLLM's triton_kernels, or
#: the smoke imports, takes seconds on a bundle; 120 s leaves room for a cold disk cache on a loaded
#: runner, and still names a hang in two minutes rather than after ten minutes of silence.
IMPORT_TIMEOUT_S = 120.0
#: The bundle's CC (zig cc) with an empty cache first builds the C runtime objects and libc stubs for its
#: target, tens of seconds on a slow runner, before the smoke extension itself.
COMPILE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class QualifyRules:
    system_libraries: frozenset[str]  # qualify.toml's, with the manylinux policy's for the platform
    system_library_dirs: tuple[str, ...]
    smoke_imports: tuple[str, ...]
    optional: Mapping[str, frozenset[str]] = field(default_factory=dict)  # package -> libraries it may lack
    extensions: tuple[ExtensionRule, ...] = ()  # vLLM's native extensions by version (components.toml)
    cuda_libraries: tuple[str, ...] = ()  # file name patterns a ROCm bundle must not hold
    platform: str = field(kw_only=True)  # python.platform: the floor the bundle claims (x86_64-manylinux_2_35)


@dataclass
class CheckResult:
    name: str
    passed: bool
    summary: str
    problems: list[str] = field(default_factory=list)
    #: What a measuring check measured (tier 2's concurrency), kept in the report and in release.json.
    figures: dict[str, float] = field(default_factory=dict)


@dataclass
class Report:
    target: str
    checks: list[CheckResult]
    tier: str = "0"
    #: Tier 0's measured floor (floor.Floor.to_json): the highest symbol versions the tree's files need.
    floor: dict[str, Any] | None = None

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    def failures(self) -> list[CheckResult]:
        return [check for check in self.checks if not check.passed]

    def to_json(self) -> bytes:
        checks = [{k: v for k, v in asdict(c).items() if k != "figures" or v} for c in self.checks]
        doc = {"tier": self.tier, "target": self.target, "passed": self.passed, "checks": checks}
        return dump_json(doc | ({"floor": self.floor} if self.floor is not None else {}))


def manylinux_libraries(platform: str) -> frozenset[str]:
    """The libraries the manylinux policy of ``platform`` (``x86_64-manylinux_2_35``) lets a wheel take
    from the system: auditwheel's own policy data, the reference for what manylinux allows."""
    whitelist: frozenset[str] = manylinux_policy(platform).whitelist
    return whitelist


def load_rules(recipes_dir: Path, platform: str, extensions: tuple[ExtensionRule, ...] = ()) -> QualifyRules:
    rules = Table.of(read_toml(recipes_dir / QUALIFY_FILE), QUALIFY_FILE)
    optional = rules.table("optional-libraries") if "optional-libraries" in rules.data else None
    return QualifyRules(
        frozenset(rules.strings("system-libraries")) | manylinux_libraries(platform),
        rules.strings("system-library-dirs"),
        rules.strings("smoke-imports"),
        {canonicalize_name(p): frozenset(optional.strings(p)) for p in optional.data} if optional else {},
        extensions,
        rules.strings("cuda-libraries"),
        platform=platform,
    )


def _expand(entry: str, origin: Path) -> Path:
    return Path(entry.replace("$ORIGIN", str(origin)).replace("${ORIGIN}", str(origin)))


def _resolves(needed: str, origin: Path, search: list[Path], rules: QualifyRules) -> bool:
    if "/" in needed:  # a path, e.g. python-build-standalone's $ORIGIN/../lib/libpython3.12.so.1.0
        return _expand(needed, origin).exists()
    return needed in rules.system_libraries or any((d / needed).exists() for d in search)


def owners(site: Path) -> dict[Path, str]:
    """Each installed file -> the distribution whose RECORD lists it (for naming problems by package)."""
    owned: dict[Path, str] = {}
    for record in records(site):
        dist = canonicalize_name(record.parent.name.removesuffix(".dist-info").rsplit("-", 1)[0])
        try:
            entries = read_record(record)
        except MalformedRecordError:
            continue  # check_records names it
        for entry in entries:
            owned[resolve(site, entry)] = dist
    return owned


def check_elf_closure(layout: Layout, rules: QualifyRules, elf_files: Mapping[Path, DynamicInfo]) -> CheckResult:
    """Every DT_NEEDED resolves, save what a package is allowed to lack (qualify.toml's
    optional-libraries: a feature of it the server does not use); those are listed as notes. ``elf_files``:
    the tree's dynamic ELF files (relocate.dynamic_files)."""
    launcher_dirs = [layout.site / d for d in library_dirs(layout)] + [layout.root / "lib"]
    owned = owners(layout.site)
    problems, notes = [], []
    for path, info in elf_files.items():
        search = [_expand(e, path.parent) for e in (*info.rpath, *info.runpath) if e] + launcher_dirs
        package = owned.get(Path(os.path.normpath(path)))
        for needed in info.needed:
            if _resolves(needed, path.parent, search, rules):
                continue
            where = f"{package}: " if package else ""
            line = f"{where}{path.relative_to(layout.root)} needs {needed}"
            if package and needed in rules.optional.get(package, ()):
                notes.append(f"{line} (optional for {package}, qualify.toml)")
            else:
                problems.append(f"{line}, found neither in the bundle nor in the system allow-list")
    summary = f"{len(elf_files)} ELF files, every DT_NEEDED resolved"
    if notes:
        summary += f"; {len(notes)} optional libraries absent: " + "; ".join(notes[:3])
    return CheckResult("elf-closure", not problems, summary, problems)


def check_symbol_versions(
    layout: Layout, rules: QualifyRules, elf_files: Mapping[Path, DynamicInfo], floor: Floor
) -> CheckResult:
    """Every symbol version every ELF file needs is one the floor's manylinux policy allows (floor.py): a
    file built on a newer system than the bundle claims names the file, the symbols, their version and
    the floor. ``floor``: what the files need at most (floor.measure)."""
    policy = manylinux_policy(rules.platform)
    found = excesses(elf_files, policy)
    problems = [describe(excess, layout.root, policy) for excess in found[:SHOWN]]
    problems += [f"and {len(found) - SHOWN} more"] if len(found) > SHOWN else []
    needs = ", ".join(f"{prefix} {version}" for prefix, version in sorted(floor.highest.items()))
    summary = f"{len(elf_files)} ELF files need at most {needs or 'no versioned symbol'}: {floor.platform}"
    summary += f" (the bundle claims {policy.name})"
    return CheckResult("symbol-versions", not problems, summary, problems)


def check_search_paths(layout: Layout, rules: QualifyRules, elf_files: Mapping[Path, DynamicInfo]) -> CheckResult:
    problems = []
    for path, info in elf_files.items():
        for entry in (*info.rpath, *info.runpath):
            if entry and not entry.startswith(("$ORIGIN", "${ORIGIN}")) and entry not in rules.system_library_dirs:
                problems.append(f"{path.relative_to(layout.root)} has an absolute RPATH/RUNPATH {entry}")
    return CheckResult("search-paths", not problems, "RPATH/RUNPATH entries are $ORIGIN-relative", problems)


def _dynamic_symbols(path: Path) -> tuple[set[str], set[str]]:
    """(defined, undefined) dynamic symbols of an ELF file."""
    defined: set[str] = set()
    undefined: set[str] = set()
    try:
        with path.open("rb") as handle:
            section = ELFFile(handle).get_section_by_name(".dynsym")
            if isinstance(section, SymbolTableSection):
                for symbol in section.iter_symbols():
                    if not symbol.name or symbol["st_info"]["bind"] == "STB_LOCAL":
                        continue
                    (undefined if symbol["st_shndx"] == "SHN_UNDEF" else defined).add(symbol.name)
    except (ELFError, OSError):
        pass
    return defined, undefined


def check_torch_abi(layout: Layout) -> CheckResult:
    extensions = (
        [p for p in (layout.site / "vllm").rglob("*.so") if p.is_file()] if (layout.site / "vllm").is_dir() else []
    )
    if not extensions:
        return CheckResult("torch-abi", True, "vLLM has no native extensions (Python-only build)")
    provided: set[str] = set()
    for directory in [layout.site / "torch" / "lib", *(layout.site / d for d in library_dirs(layout))]:
        for library in sorted(directory.glob("*.so*")) if directory.is_dir() else []:
            provided |= _dynamic_symbols(library)[0]
    problems = []
    for extension in extensions:
        missing = sorted(s for s in _dynamic_symbols(extension)[1] if s.startswith(TORCH_MANGLED) and s not in provided)
        problems += [
            f"{extension.relative_to(layout.site)} needs {symbol}, which no bundled torch/ROCm library defines"
            for symbol in missing
        ]
    return CheckResult(
        "torch-abi", not problems, f"{len(extensions)} vLLM extensions link against the bundled torch", problems
    )


def _metadata(layout: Layout, name: str) -> tuple[str, list[str]] | None:
    for info in layout.site.glob("*.dist-info"):
        meta = Parser().parsestr((info / "METADATA").read_text(errors="replace"), headersonly=True)
        if canonicalize_name(meta.get("Name", "")) == name:
            return meta.get("Version", ""), meta.get_all("Requires-Dist") or []
    return None


def check_torch_requirement(layout: Layout) -> CheckResult:
    vllm, torch = _metadata(layout, "vllm"), _metadata(layout, "torch")
    if vllm is None or torch is None:
        missing = "vllm" if vllm is None else "torch"
        return CheckResult("torch-requirement", False, "vLLM and torch are installed", [f"{missing} is not installed"])
    torch_version = Version(torch[0])
    problems = []
    for text in vllm[1]:
        requirement = Requirement(text)
        if (
            canonicalize_name(requirement.name) == "torch"
            and (requirement.marker is None or requirement.marker.evaluate())
            and not requirement.specifier.contains(torch_version, prereleases=True)
        ):
            problems.append(f"vLLM requires {text}, the bundle has torch {torch_version}")
    return CheckResult(
        "torch-requirement", not problems, f"vLLM's torch requirement allows torch {torch_version}", problems
    )


def check_records(layout: Layout) -> CheckResult:
    problems = verify_records(layout.site)
    count = len(list(layout.site.glob("*.dist-info/RECORD")))
    return CheckResult(
        "records", not problems, f"{count} distributions: every RECORD file present, hashes match", problems
    )


#: Where the bundle's two holders of prebuilt device code keep it, as site-packages globs: TheRock's ROCm
#: SDK (its math libraries' platform directory) and torch.
DEVICE_CODE_HOMES = {"the ROCm SDK's libraries": "_rocm_sdk_libraries*", "torch": "torch"}


def check_device_code(layout: Layout, target: Target) -> CheckResult:
    """The ROCm SDK and torch each carry code for every ISA of the target: as a kpack archive named for the
    ISA (``.kpack/<name>_<isa>.kpack``, what a multi-arch index's device packages install), or as code
    objects in their libraries' fat binaries (a per-family index's wheels, built without the kpack split)."""
    problems = []
    for holder, pattern in DEVICE_CODE_HOMES.items():
        homes = [path for path in sorted(layout.site.glob(pattern)) if path.is_dir()]
        missing = [isa for isa in target.isas if not any(_kpacks(home, isa) for home in homes)]
        if missing:
            carried = _fat_binary_isas(homes, set(missing))
            problems += [
                f"no device code for {isa} in {holder} (no .kpack, no code object)"
                for isa in missing
                if isa not in carried
            ]
    return CheckResult(
        "device-code", not problems, f"ROCm SDK and torch device code for {', '.join(target.isas)}", problems
    )


def _kpacks(home: Path, isa: str) -> list[Path]:
    return [path for path in (home / ".kpack").glob(f"*_{isa}.kpack") if path.is_file()]


def _fat_binary_isas(homes: list[Path], wanted: set[str]) -> set[str]:
    """The ISAs of ``wanted`` that code objects in the fat binaries of ``homes``' libraries are for; reads
    no further than it must (a real SDK's and torch's libraries hold gigabytes of them)."""
    found: set[str] = set()
    for home in homes:
        for library in sorted((home / "lib").rglob("*.so*")):
            if found >= wanted:
                return found
            if library.is_file() and not library.is_symlink() and is_elf(library):
                found |= fatbin_isas(library) & wanted
    return found


def check_vllm_device_code(layout: Layout, target: Target, rules: QualifyRules) -> CheckResult:
    """Every native extension a ROCm build of this vLLM version has, with code objects for every ISA of
    the target in each HIP one (components.toml ``[[vllm.extensions]]``). A vLLM without them passes
    only when the bundle says it was built Python-only on request (its launcher's header)."""
    if detect_vllm_build(layout.root) == PYTHON_ONLY:
        return CheckResult("vllm-device-code", True, "Python-only vLLM, built on request: no GPU kernels of its own")
    installed = _metadata(layout, "vllm")
    if installed is None:
        return CheckResult("vllm-device-code", False, "vLLM's extensions", ["vllm is not installed"])
    version = Version(installed[0])
    rule = next((r for r in rules.extensions if r.versions.contains(version, prereleases=True)), None)
    if rule is None:
        problem = (
            f"no [[vllm.extensions]] entry in components.toml covers vLLM {version}: tier 0 cannot tell its kernels"
        )
        return CheckResult("vllm-device-code", False, "vLLM's extensions", [problem])
    problems, _ = extension_problems(find_in_tree(layout.site, rule), rule, target.isas)
    summary = (
        f"{len(rule.names)} vLLM extensions present; {len(rule.device_code)} carry code for {', '.join(target.isas)}"
    )
    return CheckResult("vllm-device-code", not problems, summary, problems)


def check_no_cuda(layout: Layout, rules: QualifyRules) -> CheckResult:
    """No CUDA runtime library and no nvidia-* distribution: a package's CUDA build slipped in."""
    problems = [
        f"{path.relative_to(layout.root)} is a CUDA library"
        for path in regular_files(layout.root)
        if any(fnmatch.fnmatchcase(path.name, pattern) for pattern in rules.cuda_libraries)
    ]
    owned = {dist for dist in owners(layout.site).values() if dist.startswith("nvidia-")}
    problems += [f"{dist} (a CUDA distribution) is installed" for dist in sorted(owned)]
    return CheckResult("no-cuda", not problems, "no CUDA library, no nvidia-* distribution", problems)


def check_symlinks(layout: Layout) -> CheckResult:
    problems = symlink_problems(layout.root)
    return CheckResult("symlinks", not problems, "every symlink stays inside the bundle", problems)


def check_launcher(layout: Layout) -> CheckResult:
    launcher, problems = layout.root / "bin" / "vllm-server", []
    if not launcher.is_file():
        return CheckResult("launcher", False, "bin/vllm-server", ["bin/vllm-server is missing"])
    if not os.access(launcher, os.X_OK):
        problems.append("bin/vllm-server is not executable")
    syntax = subprocess.run(["sh", "-n", str(launcher)], capture_output=True, text=True, check=False)
    if syntax.returncode != 0:
        problems.append(f"bin/vllm-server is not valid sh: {syntax.stderr.strip()}")
    if not layout.python.is_file() or not os.access(layout.python, os.X_OK):
        problems.append(f"the bundled interpreter {layout.python.relative_to(layout.root)} is missing")
    return CheckResult("launcher", not problems, "launcher valid and executable; interpreter present", problems)


#: The sonames of libraries that keep process-wide state: the HSA and HIP runtimes, and rocprofiler's,
#: whose client registration is a one-shot static (vllm-project/vllm#56190). Two files of one in a process
#: are two runtimes: vLLM's image points every copy at one file, because it has both SDK trees
#: (docker/Dockerfile.rocm_base:141-156, 384-399); a bundle ships the core tree alone.
SINGLE_COPY = (
    "libhsa-runtime64.so.1",
    "libamdhip64.so.7",
    "librocprofiler-sdk.so.1",
    "librocprofiler-register.so.0",
    "librocprofiler-sdk-roctx.so.1",
)


def check_rocm_runtime(layout: Layout, elf_files: Mapping[Path, DynamicInfo], fixes: Path) -> CheckResult:
    """TheRock's runtime as vLLM's own image runs it (docs/building-rocm.md): each fix of patches/rocm-sdk
    the bundle's SDK version needs is applied, and each library of SINGLE_COPY is one file."""
    problems = []
    version = installed_rocm_version(layout.site)
    if version is None:
        problems.append("site-packages holds no one rocm distribution: which SDK fixes it needs is unknown")
    else:
        for patch in fixes_not_applied(layout.site, read_series(fixes), version):
            files = ", ".join(f"site-packages/{name}" for name in patch.files)
            problems.append(f"{files} lacks the fix {patch.id} ({patch.path.name}), which ROCm {version} needs")
    paths: dict[str, dict[tuple[int, int], str]] = {}  # soname -> inode -> the first path of it
    for path, info in elf_files.items():
        if info.soname in SINGLE_COPY:
            stat = path.stat()
            paths.setdefault(info.soname, {}).setdefault((stat.st_dev, stat.st_ino), str(path.relative_to(layout.root)))
    problems += [
        f"{soname} is shipped {len(found)} times ({', '.join(found.values())}): one process would load two runtimes"
        for soname, found in sorted(paths.items())
        if len(found) > 1
    ]
    summary = f"ROCm {version}: its SDK fixes applied, one copy of each runtime library"
    return CheckResult("rocm-runtime", not problems, summary, problems)


def check_runtime(layout: Layout) -> CheckResult:
    """The runtime the launcher relies on is in site-packages as this tool wrote it: without its ``.pth``
    a killed server would leave its EngineCore holding GPU memory (runtime/orphans.py)."""
    problems = []
    for name, text in runtime_files().items():
        path = layout.site / name
        if not path.is_file():
            problems.append(f"site-packages/{name} is missing")
        elif path.read_text(errors="replace") != text:
            problems.append(f"site-packages/{name} is not the runtime this tool ships")
    return CheckResult("runtime", not problems, f"{RUNTIME_PTH} and its runtime in site-packages", problems)


def check_toolchain(layout: Layout) -> CheckResult:
    """The C compiler Triton runs at first GPU use (the launcher's ``CC``): the wrapper is there and
    executable, and so is the zig it runs (toolchain.py)."""
    problems = toolchain_problems(layout.root)
    summary = f"{WRAPPER} (the launcher's CC) executable"
    if not problems:
        summary += f"; the zig it runs ({named_zig(layout.root)} cc -target {named_target(layout.root)}) present"
    return CheckResult("c-toolchain", not problems, summary, problems)


#: Built in the relocated copy with the bundle's CC and Triton's flags, then loaded by its python: the
#: headers (libc's, Python's), the crt objects and the linker must all come from the bundle.
SMOKE_C = """#include <Python.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
int vllm_bundle_cc_smoke(void) { char b[8]; snprintf(b, sizeof b, "%d", 42); return atoi(b) + (dlerror() != NULL); }
"""
SMOKE_LOAD = "import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).vllm_bundle_cc_smoke())"


def _bounded(
    command: list[str], env: dict[str, str], timeout: float, who: str, doing: str
) -> str | subprocess.CompletedProcess[str]:
    """The bundle's own ``command`` run by :func:`run_bounded`: its result, or what went wrong as one problem
    line naming ``who`` ran it ("the bundle's python") and ``doing`` what ("importing vLLM's triton_kernels")."""
    try:
        result = run_bounded(command, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{who} did not finish {doing} within {timeout:g} s (killed)"
    except OSError as err:
        return f"{who} could not be run for {doing}: {err.strerror or err}"
    if result.left_running:
        processes = "1 process" if result.left_running == 1 else f"{result.left_running} processes"
        return f"{who} left {processes} running after {doing} (killed)"
    return result


def _last_line(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stderr.strip().splitlines() or [result.stdout.strip() or f"exit status {result.returncode}"])[-1]


def _first_error(result: subprocess.CompletedProcess[str]) -> str:
    """A compiler's first ``error`` line (clang ends with the useless "1 error generated."), else its last."""
    errors = [line.strip() for line in result.stderr.splitlines() if "error" in line and "generated" not in line]
    return errors[0] if errors else _last_line(result)


def _compile_problem(there: Layout, work: Path) -> str | None:
    """Build a shared object as Triton's ``_build`` does (triton-lang/triton python/triton/runtime/build.py:
    ``[CC, src, -O3, -shared, -fPIC, -Wno-psabi, -o, so, -I...]``) with the moved bundle's CC, a fresh zig
    cache and no HOME, and load it with the moved bundle's python; None when both work."""
    source, library = work / "smoke.c", work / "smoke.so"
    source.write_text(SMOKE_C)
    include = there.root / "include" / f"python{there.minor}"
    cc = [str(there.root / WRAPPER), str(source), "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", str(library)]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ZIG_GLOBAL_CACHE_DIR": str(work / "zig-cache")}
    built = _bounded([*cc, f"-I{include}"], env, COMPILE_TIMEOUT_S, "the bundle's CC", "building a C extension")
    if isinstance(built, str):
        return built
    if built.returncode != 0:
        return f"the bundle's CC could not build a C extension: {_first_error(built)}"
    load = [str(there.python), "-P", "-c", SMOKE_LOAD, str(library)]
    loaded = _bounded(load, env, IMPORT_TIMEOUT_S, "the bundle's python", "loading the C extension its CC built")
    if isinstance(loaded, str):
        return loaded
    if loaded.returncode != 0 or loaded.stdout.strip() != "42":
        return f"the C extension the bundle's CC built does not load: {_last_line(loaded)}"
    return None


def check_build_paths(layout: Layout, build_dir: Path | None) -> CheckResult:
    if build_dir is None:
        return CheckResult("build-paths", True, "no build directory to look for (archive given)")
    hits = files_mentioning(layout.root, str(build_dir.resolve()).encode())
    problems = [f"{p.relative_to(layout.root)} names the build directory {build_dir.resolve()}" for p in hits]
    return CheckResult("build-paths", not problems, "no file names the build directory", problems)


def check_size(layout: Layout, target: Target) -> CheckResult:
    """The tree fits the budget its installers' time limits allow (recipes/targets.toml [size-budget])."""
    size = sum(p.stat().st_size for p in regular_files(layout.root))
    budget = target.size_budget
    problems = (
        []
        if size <= budget.bytes
        else [
            f"the bundle is {size / 2**30:.2f} GiB, over its {budget.gib:.2f} GiB budget ({budget.derivation()}): "
            "an installer would time out extracting it"
        ]
    )
    return CheckResult("size", not problems, f"{size / 2**30:.2f} GiB of {budget.gib:.2f} GiB", problems)


#: Run by the bundle's python: vLLM's triton_kernels imported as vLLM imports it (vllm/utils/import_utils.py
#: import_triton_kernels: ``vllm.third_party.triton_kernels`` aliased as ``triton_kernels``, whose modules
#: import each other and Triton's internals by those names), then every module of it, with the bundle's
#: Triton. A module that needs a Triton name the bundle's Triton lacks (triton_kernels of Triton 3.8 with
#: Triton 3.7) fails here, not at the first request to an MoE model.
TRITON_KERNELS_IMPORTS = """import importlib, json, pkgutil, sys
import triton
try:
    import vllm.third_party.triton_kernels as kernels
except ModuleNotFoundError as err:
    if err.name not in ("vllm.third_party", "vllm.third_party.triton_kernels"):
        raise
    print(json.dumps({"triton": triton.__version__, "absent": True}))
    sys.exit(0)
sys.modules["triton_kernels"] = kernels
names, failed = [], []
for info in pkgutil.walk_packages(kernels.__path__, "triton_kernels."):
    names.append(info.name)
    try:
        importlib.import_module(info.name)
    except Exception as err:
        failed.append(f"{info.name}: {type(err).__name__}: {err}")
print(json.dumps({"triton": triton.__version__, "modules": names, "failed": failed}))
"""


def check_triton_kernels(layout: Layout) -> CheckResult:
    """vLLM's triton_kernels and the bundle's Triton are one pair: every module of it imports (a bundle whose
    vLLM was built Python-only, on request, has none)."""
    env = {"LD_LIBRARY_PATH": ":".join(str(layout.site / d) for d in library_dirs(layout)), "PYTHONNOUSERSITE": "1"}
    # -B: the bundle is a finished stage; importing writes no __pycache__ into it
    command = [str(layout.python), "-B", "-P", "-c", TRITON_KERNELS_IMPORTS]
    result = _bounded(command, env, IMPORT_TIMEOUT_S, "the bundle's python", "importing vLLM's triton_kernels")
    if isinstance(result, str):
        return CheckResult("triton-kernels", False, "triton and vLLM's triton_kernels", [result])
    try:
        found = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return CheckResult("triton-kernels", False, "triton and vLLM's triton_kernels", [_last_line(result)])
    if found.get("absent"):
        full = detect_vllm_build(layout.root) == "rocm"
        problems = ["vllm.third_party.triton_kernels is missing from a vLLM built for ROCm"] if full else []
        summary = f"no vllm.third_party.triton_kernels (vLLM build: {detect_vllm_build(layout.root)})"
        return CheckResult("triton-kernels", not problems, summary, problems)
    problems = [f"{line} (with Triton {found['triton']})" for line in found["failed"]]
    summary = f"vLLM's triton_kernels ({len(found['modules'])} modules) imports with Triton {found['triton']}"
    return CheckResult("triton-kernels", not problems, summary, problems)


def check_relocated_smoke(layout: Layout, rules: QualifyRules) -> CheckResult:
    with tempfile.TemporaryDirectory(prefix="vllm-bundle-smoke-") as tmp:
        moved = Path(tmp) / "moved bundle"
        shutil.copytree(layout.root, moved, symlinks=True, copy_function=link_or_copy)
        there = Layout(moved, layout.minor)
        env = {"LD_LIBRARY_PATH": ":".join(str(there.site / d) for d in library_dirs(there)), "PYTHONNOUSERSITE": "1"}
        code = "; ".join(f"import {module}" for module in rules.smoke_imports)
        doing = f"importing {', '.join(rules.smoke_imports)}"
        result = _bounded([str(there.python), "-P", "-c", code], env, IMPORT_TIMEOUT_S, "the bundle's python", doing)
        if isinstance(result, str):
            problems = [result]
        else:
            problems = [] if result.returncode == 0 else [f"import failed: {_last_line(result)}"]
        compiled = None if toolchain_problems(moved) else _compile_problem(there, Path(tmp))  # else c-toolchain says
        problems += [compiled] if compiled else []
    summary = f"moved elsewhere, imports {', '.join(rules.smoke_imports)}; its CC builds a C extension it loads"
    return CheckResult("relocated-smoke", not problems, summary, problems)


def qualify_tree(
    root: Path,
    minor: str,
    target: Target,
    rules: QualifyRules,
    build_dir: Path | None = None,
    progress: Callable[[str], None] = lambda name: None,
) -> Report:
    layout = Layout(root, minor)
    elf_files = dynamic_files(root)  # three checks read them
    floor = measure(elf_files, rules.platform)
    checks: list[Callable[[], CheckResult]] = [
        lambda: check_elf_closure(layout, rules, elf_files),
        lambda: check_symbol_versions(layout, rules, elf_files, floor),
        lambda: check_search_paths(layout, rules, elf_files),
        lambda: check_torch_abi(layout),
        lambda: check_torch_requirement(layout),
        lambda: check_records(layout),
        lambda: check_device_code(layout, target),
        lambda: check_vllm_device_code(layout, target, rules),
        lambda: check_no_cuda(layout, rules),
        lambda: check_symlinks(layout),
        lambda: check_launcher(layout),
        lambda: check_runtime(layout),
        lambda: check_rocm_runtime(layout, elf_files, default_rocm_fixes()),
        lambda: check_toolchain(layout),
        lambda: check_build_paths(layout, build_dir),
        lambda: check_size(layout, target),
        lambda: check_triton_kernels(layout),
        lambda: check_relocated_smoke(layout, rules),
    ]
    results = []
    for check in checks:
        result = check()
        progress(result.name)
        results.append(result)
    return Report(target.name, results, floor=floor.to_json())


@contextmanager
def bundle_root(source: Path) -> Iterator[Path]:
    """A bundle directory as is; an archive or its parts extracted (safely, as installers do) to a temp dir."""
    if source.is_dir() and (source / "bin").is_dir():
        yield source
        return
    parts = sorted(p for p in source.iterdir() if is_part(p.name)) if source.is_dir() else [source]
    if not parts or not all(part.is_file() for part in parts):
        raise QualificationError(f"{source} is neither a bundle tree nor an archive or a directory of parts")
    with tempfile.TemporaryDirectory(prefix="vllm-bundle-qualify-") as tmp:
        root = Path(tmp) / "root"
        extract_parts(parts, root, source.name)
        yield root


STAGE_VERSION = 12  # 11: the symbol-versions check and the measured floor; 12: rocm-runtime
REPORT = "qualification.json"


def detect_minor(root: Path) -> str:
    for candidate in sorted((root / "bin").glob("python3.*")):
        if candidate.name.count(".") == 1 and candidate.name.removeprefix("python3.").isdigit():
            return candidate.name.removeprefix("python")
    raise QualificationError(f"{root} has no bin/python3.X", "is this a bundle?")


def detect_vllm_build(root: Path) -> str | None:
    """How the bundle's vLLM was built, as its launcher states it (``# vLLM build: rocm``)."""
    launcher = root / "bin" / "vllm-server"
    if launcher.is_file():
        for line in launcher.read_text(errors="replace").splitlines()[:6]:
            if line.startswith(BUILD_HEADER):
                return line.removeprefix(BUILD_HEADER).strip()
    return None


def qualify_stage(
    root: StageResult,
    minor: str,
    target: Target,
    rules: QualifyRules,
    build_dir: Path,
    *,
    out: Path,
    force: bool = False,
) -> StageResult:
    """Stage ``qualify``: the tier 0 report of the bundle tree (cached with the tree it judged)."""
    inputs = {
        "root": root.key,
        "rules": {
            "system_libraries": sorted(rules.system_libraries),
            "system_library_dirs": rules.system_library_dirs,
            "smoke_imports": rules.smoke_imports,
            "optional": {package: sorted(libs) for package, libs in sorted(rules.optional.items())},
            "extensions": [[str(r.versions), r.names, r.device_code] for r in rules.extensions],
            "cuda_libraries": rules.cuda_libraries,
            "platform": rules.platform,
        },
        "target": asdict(target),
    }

    def build(tmp: Path) -> dict[str, object]:
        report = qualify_tree(root.path, minor, target, rules, build_dir)
        (tmp / REPORT).write_bytes(report.to_json())
        return {"passed": report.passed}

    return run_stage(out, "qualify", STAGE_VERSION, inputs, build, force=force)


def read_report(path: Path) -> Report:
    doc = json.loads(path.read_text())
    checks = [CheckResult(**check) for check in doc["checks"]]
    return Report(doc["target"], checks, str(doc["tier"]), doc.get("floor"))


def failure_message(report: Report, report_path: Path) -> QualificationError:
    failed = report.failures()
    first = failed[0]
    detail = first.problems[0] if first.problems else first.summary
    return QualificationError(
        f"tier {report.tier} qualification failed ({len(failed)} of {len(report.checks)} checks): "
        f"{first.name}: {detail}",
        f"see {report_path}; --warn-only to build anyway",
    )
