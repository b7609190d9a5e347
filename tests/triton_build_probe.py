"""Run by tests/test_toolchain.py with a bundle's own python, in a chroot without a C toolchain: build
Triton's C the way Triton does at first GPU use, with ``$CC`` (what bin/vllm-server exports), then load
each result with ctypes and import it. Prints one JSON report.

    python triton_build_probe.py <libamdhip64 path> <launcher_360.c> <work dir>

- hip_utils: the bundle's own ``triton/backends/amd/driver.c`` with ``/*py_libhip_search_path*/``
  replaced by the libamdhip64 path, ``-I`` its ``include/`` (triton-lang/triton@v3.7.1
  python/triton/backends/amd/driver.py ``HIPUtils.__init__``);
- __triton_launcher: a per-signature launcher as Triton <= 3.6 generated it (tests/data/triton/README.md),
  its baked-in libamdhip64 path replaced the same way, against the same include directory;
- the command is ``_build``'s (python/triton/runtime/build.py:20-48): ``[CC, src, -O3, -shared, -fPIC,
  -Wno-psabi, -o, so] + -I<include dirs> + -I<srcdir> + -I<python include>``, run by
  ``subprocess.check_call``; the result is loaded as ``_load_module_from_path`` loads it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import types
from pathlib import Path

#: The libamdhip64 path Triton 3.6.0's make_launcher baked into launcher_360.c (tests/data/triton/README.md).
LAUNCHER_LIBHIP = "/opt/bundle/lib/libamdhip64.so"


def python_include() -> str:
    """build.py:34-39: the interpreter's include directory ('posix_local' read as 'posix_prefix')."""
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


def build(name: str, source: str, include_dirs: list[str], out: Path) -> dict[str, object]:
    """build.py ``compile_module_from_src`` + ``_build``: write ``<name>.c`` in a fresh temporary
    directory, compile it there with ``$CC``, keep the shared object in ``out``."""
    with tempfile.TemporaryDirectory() as srcdir:
        src = os.path.join(srcdir, name + ".c")
        Path(src).write_text(source)
        so = os.path.join(srcdir, f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}")
        command = [os.environ["CC"], src, "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", so]
        command += [f"-I{d}" for d in [*include_dirs, srcdir, python_include()]]
        began = time.monotonic()
        subprocess.check_call(command, stdout=subprocess.DEVNULL)
        seconds = time.monotonic() - began
        kept = out / os.path.basename(so)
        shutil.copyfile(so, kept)
    return {"command": command, "seconds": seconds, "so": str(kept)}


def load(name: str, so: str) -> types.ModuleType:
    """build.py ``_load_module_from_path``."""
    spec = importlib.util.spec_from_file_location(name, so)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    libhip, launcher_source, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    triton = importlib.util.find_spec("triton")
    assert triton is not None and triton.origin is not None
    amd = Path(triton.origin).parent / "backends" / "amd"
    include = [str(amd / "include")]
    driver = (amd / "driver.c").read_text().replace("/*py_libhip_search_path*/", libhip, 1)
    report: dict[str, object] = {"cc": os.environ["CC"], "python_include": python_include()}

    hip = build("hip_utils", driver, include, out)
    ctypes.CDLL(str(hip["so"]))
    hip_utils = load("hip_utils", str(hip["so"]))
    hip["signature"] = hip_utils.build_signature_metadata(["*fp32", "*fp32", "i32"]).hex()
    hip["arg_kernel"] = hip_utils.ARG_KERNEL
    report["hip_utils"] = hip

    launcher = build("__triton_launcher", launcher_source.read_text().replace(LAUNCHER_LIBHIP, libhip), include, out)
    ctypes.CDLL(str(launcher["so"]))
    # PyInit___triton_launcher imports triton.backends.amd.driver for its PyTDMDescriptor, which that
    # module takes from hip_utils (driver.py HIPUtils.__init__); the bundle's triton is the fixture's.
    driver_module = types.ModuleType("triton.backends.amd.driver")
    driver_module.PyTDMDescriptor = hip_utils.PyTDMDescriptor  # type: ignore[attr-defined]
    sys.modules[driver_module.__name__] = driver_module
    launcher["functions"] = sorted(n for n in dir(load("__triton_launcher", str(launcher["so"]))) if n[0] != "_")
    report["launcher"] = launcher
    print(json.dumps(report))


if __name__ == "__main__":
    main()
