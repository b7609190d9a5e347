"""The fixture's compilers compile each translation unit of vLLM's torch extensions from a stand-in, with
the very command line CMake gave: vLLM's real kernels and bindings need ROCm's and torch's headers, which
nothing here has. The compiler is the one CMake chose for the unit, as in a real build: the SDK's clang
for a HIP unit (therock.py ``compiler_wrapper``), the builder's g++ for host C++ (``host_compiler``: vLLM
0.33.0 compiles ``cumem_allocator``, ``spinloop`` and ``fs_io_C`` as CXX, CMakeLists.txt:341-356, and the
host units of its HIP extensions). CMake's own probes are compiled as they are.

A stand-in holds what tier 0 and the build's checks read of a real unit: a kernel for each
``--offload-arch`` (HIP units), ``__FILE__`` the real source's, the module's init where the real unit
registers it, and a call to each function of the ``strtol`` family the real unit calls (vllm-0.33.0
csrc/cumem_allocator.cpp:30 calls ``strtoull``): glibc 2.38's headers redirect those to ``__isoc23_*``
(``GLIBC_2.38``) when ``_GNU_SOURCE`` is on, which g++ always sets, so the builder's glibc shows in the unit
as it does in the real one.
"""

from __future__ import annotations

#: Sets ``hip``, ``ext``, ``src`` and ``obj`` from the compiler's arguments (``$@``).
PARSE_ARGUMENTS = r"""
hip= ext= src= obj= prev= stand=
for arg in "$@"; do
    case $arg in
        hip|*.hip) hip=1 ;;
        -DTORCH_EXTENSION_NAME=*) ext=${arg#-DTORCH_EXTENSION_NAME=} ;;
    esac
    [ "$prev" = "-c" ] && src=$arg
    [ "$prev" = "-o" ] && obj=$arg
    prev=$arg
done
"""
#: Writes ``$stand`` for a torch extension's unit (``$ext`` set by -DTORCH_EXTENSION_NAME: vLLM's
#: define_extension_target adds it to every unit) and puts it in ``$src``'s place in ``$@``.
STAND_IN_UNIT = r"""
if [ -n "$ext" ] && [ -n "$src" ] && [ -n "$obj" ]; then
    # Named by the unit's file name and bytes, never its absolute path: the same source builds the same
    # bytes in any build directory, as the real unit would.
    id=$({ printf '%s\n' "${src##*/}"; cat -- "$src"; } | cksum | cut -d' ' -f1)
    case $src in *.hip|*.cu) stand="$obj.stand-in.hip" ;; *) stand="$obj.stand-in.cpp" ;; esac
    {
        printf '#line 1 "%s"\n' "$src"
        if [ -n "$hip" ]; then
            printf '#include <hip/hip_runtime.h>\n'
            printf 'extern "C" __global__ void vllm_unit_%s_kernel(float *out) { out[0] = 2.0f; }\n' "$id"
        fi
        printf 'extern "C" const char *vllm_unit_%s_source(void) { return __FILE__; }\n' "$id"
        printf '#if !defined(__HIP_DEVICE_COMPILE__)\n'
        for fn in strtol strtoul strtoll strtoull; do
            if grep -q -E "(^|[^A-Za-z0-9_])$fn[[:space:]]*\(" -- "$src"; then
                printf '#include <stdlib.h>\n'
                printf 'extern "C" long long vllm_unit_%s_%s(const char *s) { return (long long) %s(s, 0, 0); }\n' "$id" "$fn" "$fn"
            fi
        done
        printf '#endif\n'
        # The module's init in the unit that defines it in vLLM's source (REGISTER_EXTENSION of
        # csrc/core/registration.h, or a PyMODINIT_FUNC of its own: one unit per extension), in the host
        # pass only. Parsing Python.h takes a unit's compile from 0.03 s to 0.2 s: every unit doing it
        # cost a third of each vLLM build.
        if grep -q -e 'REGISTER_EXTENSION(' -e 'PyMODINIT_FUNC' -- "$src"; then
            printf '#if !defined(__HIP_DEVICE_COMPILE__) && __has_include(<Python.h>)\n#include <Python.h>\n'
            printf 'static struct PyModuleDef vllm_unit_module = {PyModuleDef_HEAD_INIT, "%s", NULL, -1, NULL};\n' "$ext"
            printf 'extern "C" __attribute__((weak)) PyObject *PyInit_%s(void) { return PyModule_Create(&vllm_unit_module); }\n' "$ext"
            printf '#endif\n'
        fi
    } > "$stand"
fi
for arg do
    shift
    [ -n "$stand" ] && [ "$arg" = "$src" ] && arg=$stand
    set -- "$@" "$arg"
done
"""
HOST_COMPILER = """#!/bin/sh
# The builder's g++ as the fixture's builds see it (tests/upstream/stand_ins.py): each unit of a torch
# extension compiled from its stand-in by @REAL@, everything else as it is.
@PARSE@
@STAND_IN@
exec @REAL@ "$@"
"""


def host_compiler(real: str) -> str:
    """The ``g++`` of a fixture's builder: ``real`` (the builder's own g++), compiling stand-ins."""
    return (
        HOST_COMPILER.replace("@PARSE@", PARSE_ARGUMENTS.strip())
        .replace("@STAND_IN@", STAND_IN_UNIT.strip())
        .replace("@REAL@", real)
    )
