"""Where things live inside a bundle tree: its python, its site-packages, where each part of a wheel goes,
and the library directories the launcher puts on the search path. Its own module, importing nothing but
the standard library, because tier 0 and the release read bundles and have no need of the assembler's
wheel installer and download code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: The library path the launcher sets, in order. TheRock's own binaries find these through their RPATH;
#: Python extensions and tools run from elsewhere (Triton's, the SDK's clang and its libomp in
#: lib/llvm/lib, TheRock build_tools/github_actions/test_executable_scripts/pytest_runner.py) do not.
LIBRARY_DIR_CANDIDATES = ("_rocm_sdk_core/lib", "_rocm_sdk_core/lib/llvm/lib", "_rocm_sdk_libraries*/lib", "torch/lib")


@dataclass(frozen=True)
class Layout:
    """Where things live inside a bundle tree."""

    root: Path
    minor: str

    @property
    def site(self) -> Path:
        return self.root / "lib" / f"python{self.minor}" / "site-packages"

    @property
    def python(self) -> Path:
        return self.root / "bin" / f"python{self.minor}"

    def scheme(self) -> dict[str, str]:
        """Where pypa/installer puts each part of a wheel in this tree."""
        return {
            "purelib": str(self.site),
            "platlib": str(self.site),
            "headers": str(self.root / "include" / "site" / f"python{self.minor}"),
            "scripts": str(self.root / "bin"),
            "data": str(self.root),
        }


def library_dirs(layout: Layout) -> list[str]:
    found = []
    for pattern in LIBRARY_DIR_CANDIDATES:
        found += sorted(str(p.relative_to(layout.site)) for p in layout.site.glob(pattern) if p.is_dir())
    return found
