"""The first error of a failed vLLM build's log (tree/build_log.py), on log excerpts of real builds."""

from __future__ import annotations

from vllm_bundle.tree.build_log import first_error, summary

UV_TAIL = """Traceback (most recent call last):
  File "/site/setuptools/build_meta.py", line 432, in build_wheel
subprocess.CalledProcessError: Command '['cmake', '/src', '-G', 'Ninja']' returned non-zero exit status 1.
error: Failed to build `/build/.vllm-wheel.build/src`
  cause: The build backend returned an error
"""
CMAKE_CONFIGURE = """-- Found Python: /site/bin/python3.11
CMake Error at /build/site/cmake/data/share/cmake-3.31/Modules/CMakeDetermineHIPCompiler.cmake:217 (message):
  The ROCm root directory:

   /build/site/_rocm_sdk_core

  does not contain the HIP runtime CMake package, expected at one of:

   /build/site/_rocm_sdk_core/lib/cmake/hip-lang/hip-lang-config.cmake

Call Stack (most recent call first):
  CMakeLists.txt:38 (project)
-- Configuring incomplete, errors occurred!
"""
# A configure's feature probe fails (and fails nothing) before the unit that stops the build.
PROBE = """hipblaslt is NOT using scale pointer outer vec: Change Dir: '/build/temp/CMakeFiles/CMakeTmp'

Run Build Command(s): /build/site/bin/ninja -v cmTC_cebf5
[1/2] /build/clang++ -std=gnu++20 -o CMakeFiles/cmTC_cebf5.dir/t.cc.o -c /build/temp/hipblaslt_test_outer_vec.cc
FAILED: [code=1] CMakeFiles/cmTC_cebf5.dir/hipblaslt_test_outer_vec.cc.o
/build/clang++ -std=gnu++20 -o CMakeFiles/cmTC_cebf5.dir/t.cc.o -c /build/temp/hipblaslt_test_outer_vec.cc
/build/temp/hipblaslt_test_outer_vec.cc:4:5: error: unknown type name 'hipblasLtMatmulMatrixScale_t'
2 errors generated.
ninja: build stopped: subcommand failed.
"""
NINJA_BUILD = """-- Configuring done
-- Configuring done
[12/74] Building HIP object CMakeFiles/_C.dir/csrc/attention/octave_prefill_rdna3.hip.o
FAILED: [code=1] CMakeFiles/_C.dir/csrc/attention/octave_decode_mfma_cdna.hip.o
/build/site/_rocm_sdk_devel/lib/llvm/bin/clang++ -DTORCH_EXTENSION_NAME=_C -mllvm -amdgpu-mfma-vgpr-form -c x.hip
clang (LLVM option parsing): Unknown command line argument '-amdgpu-mfma-vgpr-form'.
[13/74] Building HIP object CMakeFiles/_C.dir/csrc/attention/octave_prefill_cdna.hip.o
ninja: build stopped: subcommand failed.
"""
SETUP_PY = """running build_ext
Copying build/lib.linux-x86_64-cpython-311/vllm/third_party/triton_kernels to vllm/third_party/triton_kernels
error: [Errno 2] No such file or directory: 'build/lib.linux-x86_64-cpython-311/vllm/third_party/triton_kernels'
error: Failed to build `/build/.vllm-wheel.build/src`
"""
IMPORT = """  File "<string>", line 21, in <module>
ModuleNotFoundError: No module named 'setuptools_rust'
error: Failed to build `/build/.vllm-wheel.build/src`
"""


def test_a_failed_configure_is_cmakes_error_block() -> None:
    block = first_error(CMAKE_CONFIGURE + UV_TAIL)
    assert block[0].startswith("CMake Error at ") and block[-1].endswith("/hip-lang/hip-lang-config.cmake")
    assert "Call Stack (most recent call first):" not in block, "the message, not CMake's call stack"
    line = summary(block)
    assert line.startswith("CMake Error at CMakeDetermineHIPCompiler.cmake:217 (message): The ROCm root directory:")
    assert "does not contain the HIP runtime CMake package" in line and "\n" not in line


def test_a_failed_unit_is_ninjas_and_the_compilers_message_not_a_probes() -> None:
    block = first_error(PROBE + NINJA_BUILD + UV_TAIL)
    assert block == [
        "FAILED: [code=1] CMakeFiles/_C.dir/csrc/attention/octave_decode_mfma_cdna.hip.o",
        "clang (LLVM option parsing): Unknown command line argument '-amdgpu-mfma-vgpr-form'.",
    ]


def test_otherwise_setup_pys_own_error_not_uvs() -> None:
    assert first_error(PROBE + SETUP_PY) == [SETUP_PY.splitlines()[2]], "a failed probe is no failure"
    assert first_error(IMPORT) == ["ModuleNotFoundError: No module named 'setuptools_rust'"]
    assert first_error("Building wheel...\n") == []


def test_a_summary_is_cut() -> None:
    assert summary(["x" * 400], limit=50) == "x" * 49 + "…"
