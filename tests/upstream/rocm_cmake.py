"""TheRock's ROCm CMake packages, modelled: nothing reachable from here carries them (they are in
TheRock's ``rocm-sdk-devel`` tarball, on AMD's index).

What is modelled, and from where:

- **Which packages**: every ``find_package`` of a ROCm torch's ``Caffe2/public/LoadHIP.cmake`` (real bytes,
  torch_cmake.py): ``HIP`` in module mode (``lib/cmake/hip/FindHIP.cmake``), then ``hip``, ``rocm-core``,
  amd_comgr, rocrand, hiprand, rocblas, hipblas, miopen, hipfft, hipsparse, rocprim, hipcub, rocthrust,
  hipsolver, rocsolver, hiprtc, hipblaslt, hsa-runtime64 and rocm_smi in config mode, and CMake's own
  ``enable_language(HIP)``, which needs ``lib/cmake/hip-lang/hip-lang-config.cmake`` under the root the
  compiler reports (CMake Modules/CMakeDetermineHIPCompiler.cmake, CMakeHIPInformation.cmake).
- **Where each library lives**: the runtime parts in ``_rocm_sdk_core`` (HIP, comgr, HSA, hiprtc, SMI,
  rocm-core) and the math libraries in ``_rocm_sdk_libraries`` (ROCm/TheRock
  build_tools/build_python_packages.py:540-561; its comment at 462-466: the devel tarball "is only valid
  when the matching family's library wheel is co-installed"); header-only ones (rocprim, hipcub,
  rocthrust) only in the devel tree.
- **How the devel tree names them**: every file a runtime wheel holds is a relative symlink into that
  wheel's platform directory, ``lib/librocblas.so.5 -> ../../_rocm_sdk_libraries/lib/librocblas.so.5``,
  and the unversioned name is a link to the soname (ROCm/TheRock
  build_tools/_therock_utils/py_packaging.py:702-741, ``_populate_devel_file``: soname aliases, then
  "Already materialized: Link to it").
- **The form of each package**: ``<name>-config.cmake``, ``<name>-config-version.cmake`` and the
  export set's ``*-targets.cmake`` / ``*-release.cmake`` as CMake's install(EXPORT) writes them
  (Kitware/CMake v3.31 Source/cmExportCMakeConfigGenerator.cxx:539-585,
  cmExportInstallCMakeConfigGenerator.cxx:110-126; torch's real, CMake-generated Caffe2Targets.cmake
  shows the same): the imported targets, their files under ``${_IMPORT_PREFIX}``, and the loop that stops
  configure with "The imported target ... references the file ... but this file does not exist." when a
  file is missing. ROCm's math libraries write theirs with rocm-cmake's ``rocm_export_targets``
  (ROCm/rocm-cmake share/rocmcmakebuildtools/cmake/ROCMInstallTargets.cmake:322-426), which calls the
  same install(EXPORT); amd_comgr, hsa-runtime64 (``hsa-runtime64Targets.cmake``), rocm_smi
  (``rocm_smiTargets.cmake``), hiprtc and rocm-core (``rocmCoreTargets.cmake``) write their own, under
  the names and targets given below (ROCm/rocm-systems projects/*/CMakeLists.txt,
  ROCm/llvm-project amd/comgr/CMakeLists.txt). HIP's own: ``hip::amdhip64``/``host``/``device`` from
  ``INSTALL(EXPORT hip-targets NAMESPACE hip::)`` and ``hip-lang::*`` from ``hip-lang-targets``
  (ROCm/rocm-systems projects/clr/hipamd/src/CMakeLists.txt, hipamd/hip-config.cmake.in: hip_INCLUDE_DIR,
  HIP_PLATFORM, HIP_RUNTIME, HIP_COMPILER).
- **Sonames**: the major each project's CMakeLists sets (rocblas 5, hipblaslt 1, rocrand 1, hiprand 1,
  hipfft 0, hipsparse 4, hipsolver 1, rocsolver 0, comgr 3, hsa 1, hiprtc 7, rocm-core 1). Not
  confirmed from a source: hipblas's (3 here), MIOpen's (1) and rocm_smi64's (1, from a git tag).

Not modelled: ``FindHIP.cmake`` asks ``hipconfig --version`` (ROCm/HIP cmake/FindHIP.cmake:180-245) where
this one reads ``hip/hip_version.h``; the packages' compile definitions, their dependency chains
(``find_dependency``), their real include trees (one header per package, where LoadHIP reads one).
"""

from __future__ import annotations

from dataclasses import dataclass

CORE, LIBRARIES, DEVEL = "_rocm_sdk_core", "_rocm_sdk_libraries", "_rocm_sdk_devel"


@dataclass(frozen=True)
class Package:
    """One ROCm CMake package: its name for find_package, its imported targets (target -> library file
    under ``lib/``, or None for an interface target) and the wheel whose platform directory holds them."""

    name: str
    targets: dict[str, str | None]
    home: str  # CORE, LIBRARIES or DEVEL (header-only)
    header: str | None = None  # the one header modelled, under include/
    export: str = ""  # the export set's file stem, when it is not <name>-targets

    @property
    def export_stem(self) -> str:
        return self.export or f"{self.name}-targets"

    @property
    def libraries(self) -> list[str]:
        return [lib for lib in self.targets.values() if lib]


PACKAGES = (
    Package("hip", {"hip::amdhip64": "libamdhip64.so.7", "hip::host": None, "hip::device": None}, CORE),
    Package("rocm-core", {"rocm-core": "librocm-core.so.1"}, CORE, "rocm-core/rocm_version.h", "rocmCoreTargets"),
    Package("amd_comgr", {"amd_comgr": "libamd_comgr.so.3"}, CORE, "amd_comgr/amd_comgr.h"),
    Package(
        "hsa-runtime64",
        {"hsa-runtime64::hsa-runtime64": "libhsa-runtime64.so.1"},
        CORE,
        "hsa/hsa.h",
        "hsa-runtime64Targets",
    ),
    Package("hiprtc", {"hiprtc::hiprtc": "libhiprtc.so.7"}, CORE, "hip/hiprtc.h"),
    Package("rocm_smi", {"rocm_smi64": "librocm_smi64.so.1"}, CORE, "rocm_smi/rocm_smi.h", "rocm_smiTargets"),
    Package("rocrand", {"roc::rocrand": "librocrand.so.1"}, LIBRARIES, "rocrand/rocrand.h"),
    Package("hiprand", {"hip::hiprand": "libhiprand.so.1"}, LIBRARIES, "hiprand/hiprand.h"),
    Package("rocblas", {"roc::rocblas": "librocblas.so.5"}, LIBRARIES, "rocblas/rocblas.h"),
    Package("hipblas", {"roc::hipblas": "libhipblas.so.3"}, LIBRARIES, "hipblas/hipblas.h"),
    Package("hipblaslt", {"roc::hipblaslt": "libhipblaslt.so.1"}, LIBRARIES, "hipblaslt/hipblaslt.h"),
    Package("miopen", {"MIOpen": "libMIOpen.so.1"}, LIBRARIES, "miopen/miopen.h"),
    Package("hipfft", {"hip::hipfft": "libhipfft.so.0"}, LIBRARIES, "hipfft/hipfft.h"),
    Package("hipsparse", {"roc::hipsparse": "libhipsparse.so.4"}, LIBRARIES, "hipsparse/hipsparse.h"),
    Package("hipsolver", {"roc::hipsolver": "libhipsolver.so.1"}, LIBRARIES, "hipsolver/hipsolver.h"),
    Package("rocsolver", {"roc::rocsolver": "librocsolver.so.0"}, LIBRARIES, "rocsolver/rocsolver.h"),
    Package("rocprim", {"roc::rocprim": None}, DEVEL, "rocprim/rocprim.hpp"),
    Package("hipcub", {"hip::hipcub": None}, DEVEL, "hipcub/hipcub.hpp"),
    Package("rocthrust", {"roc::rocthrust": None}, DEVEL, "thrust/version.h"),
)

HEADER = """#----------------------------------------------------------------
# Generated CMake target import file.
#----------------------------------------------------------------
# (vllm-bundle test fixture: modelled on what install(EXPORT) writes; see tests/upstream/rocm_cmake.py)

set(CMAKE_IMPORT_FILE_VERSION 1)
set(_cmake_targets_defined "")
set(_cmake_targets_not_defined "")
set(_cmake_expected_targets "")
foreach(_cmake_expected_target IN ITEMS {targets})
  list(APPEND _cmake_expected_targets "${{_cmake_expected_target}}")
  if(TARGET "${{_cmake_expected_target}}")
    list(APPEND _cmake_targets_defined "${{_cmake_expected_target}}")
  else()
    list(APPEND _cmake_targets_not_defined "${{_cmake_expected_target}}")
  endif()
endforeach()
unset(_cmake_expected_target)
if(_cmake_targets_defined STREQUAL _cmake_expected_targets)
  unset(_cmake_targets_defined)
  unset(_cmake_targets_not_defined)
  unset(_cmake_expected_targets)
  unset(CMAKE_IMPORT_FILE_VERSION)
  return()
endif()
unset(_cmake_targets_defined)
unset(_cmake_targets_not_defined)
unset(_cmake_expected_targets)

# Compute the installation prefix relative to this file.
get_filename_component(_IMPORT_PREFIX "${{CMAKE_CURRENT_LIST_FILE}}" PATH)
get_filename_component(_IMPORT_PREFIX "${{_IMPORT_PREFIX}}" PATH)
get_filename_component(_IMPORT_PREFIX "${{_IMPORT_PREFIX}}" PATH)
get_filename_component(_IMPORT_PREFIX "${{_IMPORT_PREFIX}}" PATH)
if(_IMPORT_PREFIX STREQUAL "/")
  set(_IMPORT_PREFIX "")
endif()
"""
CREATE = """
# Create imported target {target}
add_library({target} {kind} IMPORTED)

set_target_properties({target} PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${{_IMPORT_PREFIX}}/include"
)
"""
LOAD_CONFIGS = """
# Load information for each installed configuration.
file(GLOB _cmake_config_files "${{CMAKE_CURRENT_LIST_DIR}}/{stem}-*.cmake")
foreach(_cmake_config_file IN LISTS _cmake_config_files)
  include("${{_cmake_config_file}}")
endforeach()
unset(_cmake_config_file)
unset(_cmake_config_files)

# Cleanup temporary variables.
set(_IMPORT_PREFIX)

# Loop over all imported files and verify that they actually exist
foreach(_cmake_target IN LISTS _cmake_import_check_targets)
  if(CMAKE_VERSION VERSION_LESS "3.28"
      OR NOT DEFINED _cmake_import_check_xcframework_for_${{_cmake_target}}
      OR NOT IS_DIRECTORY "${{_cmake_import_check_xcframework_for_${{_cmake_target}}}}")
    foreach(_cmake_file IN LISTS "_cmake_import_check_files_for_${{_cmake_target}}")
      if(NOT EXISTS "${{_cmake_file}}")
        message(FATAL_ERROR "The imported target \\"${{_cmake_target}}\\" references the file
   \\"${{_cmake_file}}\\"
but this file does not exist.  Possible reasons include:
* The file was deleted, renamed, or moved to another location.
* An install or uninstall procedure did not complete successfully.
* The installation package was faulty and contained
   \\"${{CMAKE_CURRENT_LIST_FILE}}\\"
but not all the files it references.
")
      endif()
    endforeach()
  endif()
  unset(_cmake_file)
  unset("_cmake_import_check_files_for_${{_cmake_target}}")
endforeach()
unset(_cmake_target)
unset(_cmake_import_check_targets)

set(CMAKE_IMPORT_FILE_VERSION)
"""
RELEASE = """
# Import target "{target}" for configuration "Release"
set_property(TARGET {target} APPEND PROPERTY IMPORTED_CONFIGURATIONS RELEASE)
set_target_properties({target} PROPERTIES
  IMPORTED_LOCATION_RELEASE "${{_IMPORT_PREFIX}}/lib/{library}"
  IMPORTED_SONAME_RELEASE "{library}"
  )

list(APPEND _cmake_import_check_targets {target} )
list(APPEND _cmake_import_check_files_for_{target} "${{_IMPORT_PREFIX}}/lib/{library}" )
"""
CONFIG = """# {name}-config.cmake (vllm-bundle test fixture, tests/upstream/rocm_cmake.py)
get_filename_component(_{ident}_PREFIX "${{CMAKE_CURRENT_LIST_DIR}}/../../.." ABSOLUTE)
include("${{CMAKE_CURRENT_LIST_DIR}}/{stem}.cmake")
set({name}_INCLUDE_DIR "${{_{ident}_PREFIX}}/include")
set({name}_INCLUDE_DIRS "${{_{ident}_PREFIX}}/include")
set({name}_LIBRARIES {targets})
{extra}"""
VERSION = """# {name}-config-version.cmake: any version asked for up to this one (write_basic_package_version_file)
set(PACKAGE_VERSION "{version}")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
"""
#: ``hip-config.cmake``'s variables that LoadHIP and vLLM read beside the targets.
HIP_EXTRA = """set(HIP_PLATFORM "amd")
set(HIP_COMPILER "clang")
set(HIP_RUNTIME "rocclr")
"""
#: ``lib/cmake/hip/FindHIP.cmake`` (module mode, ``find_package(HIP 1.0 MODULE)``): HIP's root is three
#: levels above it; the version comes from ``hip/hip_version.h`` (the real module asks ``hipconfig``).
FIND_HIP = """# FindHIP.cmake (vllm-bundle test fixture, tests/upstream/rocm_cmake.py)
get_filename_component(HIP_ROOT_DIR "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(HIP_PLATFORM "amd")
file(STRINGS "${HIP_ROOT_DIR}/include/hip/hip_version.h" _hip_version_lines
     REGEX "#define HIP_VERSION_(MAJOR|MINOR|PATCH) ")
foreach(_line IN LISTS _hip_version_lines)
  string(REGEX MATCH "HIP_VERSION_(MAJOR|MINOR|PATCH) +([0-9]+)" _match "${_line}")
  set(HIP_VERSION_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
endforeach()
set(HIP_VERSION "${HIP_VERSION_MAJOR}.${HIP_VERSION_MINOR}.${HIP_VERSION_PATCH}")
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(HIP REQUIRED_VARS HIP_ROOT_DIR HIP_PLATFORM VERSION_VAR HIP_VERSION)
"""
#: ``lib/cmake/hip-lang/hip-lang-config.cmake``: what CMakeHIPInformation.cmake links HIP code with. As
#: ROCm's (ROCm/HIP@c5e11fc hip-lang-config.cmake.in:103-104, 138): every target CMake links as HIP gets
#: ``--hip-link`` through ``hip-lang::device``, the device runtime target CMake adds to each target with
#: HIP sources (CMake 3.31 Modules/CMakeHIPInformation.cmake:106-112). Not modelled: lines 116-130, which add
#: ``--rtlib=compiler-rt`` when the compiler finds its builtins library (zig's clang's resource directory
#: has none, and a vLLM extension links nothing of it).
HIP_LANG = """# hip-lang-config.cmake (vllm-bundle test fixture, tests/upstream/rocm_cmake.py)
get_filename_component(_hip_lang_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
include("${CMAKE_CURRENT_LIST_DIR}/hip-lang-targets.cmake")
set_property(TARGET hip-lang::device APPEND PROPERTY
  INTERFACE_LINK_OPTIONS "$<$<LINK_LANGUAGE:HIP>:--hip-link>"
)
set(_CMAKE_HIP_DEVICE_RUNTIME_TARGET "hip-lang::device")
"""


def _ident(name: str) -> str:
    return name.replace("-", "_")


def targets_files(stem: str, targets: dict[str, str | None]) -> dict[str, str]:
    """``<stem>.cmake`` and ``<stem>-release.cmake`` in install(EXPORT)'s form."""
    main = HEADER.format(targets=" ".join(targets))
    for target, library in targets.items():
        main += CREATE.format(target=target, kind="SHARED" if library else "INTERFACE")
    main += LOAD_CONFIGS.format(stem=stem)
    release = '# Generated CMake target import file for configuration "Release".\nset(CMAKE_IMPORT_FILE_VERSION 1)\n'
    for target, library in targets.items():
        if library:
            release += RELEASE.format(target=target, library=library)
    release += "\nset(CMAKE_IMPORT_FILE_VERSION)\n"
    return {f"{stem}.cmake": main, f"{stem}-release.cmake": release}


def package_files(package: Package, version: str) -> dict[str, bytes]:
    """``lib/cmake/<name>/*`` of one package."""
    base = f"lib/cmake/{package.name}"
    extra = HIP_EXTRA if package.name == "hip" else ""
    config = CONFIG.format(
        name=package.name,
        ident=_ident(package.name),
        stem=package.export_stem,
        targets=";".join(package.targets),
        extra=extra,
    )
    files = {
        f"{package.name}-config.cmake": config,
        f"{package.name}-config-version.cmake": VERSION.format(name=package.name, version=version),
    }
    files.update(targets_files(package.export_stem, package.targets))
    return {f"{base}/{name}": text.encode() for name, text in files.items()}


def hip_version_header(version: str) -> bytes:
    major, minor, patch = ([*version.split("."), "0", "0"])[:3]
    return (
        f"#pragma once\n#define HIP_VERSION_MAJOR {major}\n#define HIP_VERSION_MINOR {minor}\n"
        f'#define HIP_VERSION_PATCH {patch}\n#define HIP_VERSION_GITHASH "fixture"\n'
        f"#define HIP_VERSION ({major} * 10000000 + {minor} * 100000 + {patch})\n"
    ).encode()


def rocm_version_header(version: str) -> bytes:
    major, minor, patch = ([*version.split("."), "0", "0"])[:3]
    return (
        f"#pragma once\n#define ROCM_VERSION_MAJOR {major}\n#define ROCM_VERSION_MINOR {minor}\n"
        f"#define ROCM_VERSION_PATCH {patch}\n"
    ).encode()


def devel_cmake_files(version: str) -> dict[str, bytes]:
    """What only the devel tree has: every package's CMake files, FindHIP, hip-lang, and one header of
    each package (HIP's version header where LoadHIP reads the version)."""
    files: dict[str, bytes] = {}
    for package in PACKAGES:
        files.update(package_files(package, version))
        if package.header and package.header != "rocm-core/rocm_version.h":
            files[f"include/{package.header}"] = f"#pragma once\n/* {package.name} (fixture) */\n".encode()
    files["include/rocm-core/rocm_version.h"] = rocm_version_header(version)
    files["include/hip/hip_version.h"] = hip_version_header(version)
    files["lib/cmake/hip/FindHIP.cmake"] = FIND_HIP.encode()
    files["lib/cmake/hip-lang/hip-lang-config.cmake"] = HIP_LANG.encode()
    lang = targets_files(
        "hip-lang-targets",
        {"hip-lang::amdhip64": "libamdhip64.so.7", "hip-lang::host": None, "hip-lang::device": None},
    )
    files.update({f"lib/cmake/hip-lang/{name}": text.encode() for name, text in lang.items()})
    return files


def runtime_libraries(home: str) -> list[str]:
    """The library files (sonames) whose real file is in ``home``'s ``lib/``."""
    return [lib for p in PACKAGES if p.home == home for lib in p.libraries]


def soname_alias(library: str) -> str:
    """``librocblas.so.5`` -> ``librocblas.so`` (what the linker and CMake's find_library look for)."""
    return library[: library.index(".so") + 3]
