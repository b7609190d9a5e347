"""The triton_kernels source of vLLM's ROCm build: read, locked, extracted.

vLLM's configure step clones the Triton repository its ``cmake/external_projects/triton_kernels.cmake``
names (for ``VLLM_TARGET_DEVICE=rocm``: ROCm/triton at a pinned commit, vllm-0.33.0) unless the
environment's ``TRITON_KERNELS_SRC_DIR`` points at the ``triton_kernels`` package; then only that
directory's ``*.py`` files are installed into the wheel. So the lock reads the repository and commit
from the source release and pins an archive of that commit (vLLM's own docker/Dockerfile.rocm takes the
same codeload archive), and the build extracts the package from it: no clone, no network.
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path, PurePosixPath

from vllm_bundle.errors import LockError, UnsafeArchiveError
from vllm_bundle.recipes import TritonKernels
from vllm_bundle.util.extract import safe_extract
from vllm_bundle.util.fetch import Artifact, Fetcher, mirror_source

CMAKE_FILE = "cmake/external_projects/triton_kernels.cmake"
ROLE = "triton-kernels"
_ROCM_BRANCH = re.compile(r'VLLM_TARGET_DEVICE\s+STREQUAL\s+"rocm"\s*\)(?P<body>.*?)(?:else\s*\(|endif\s*\()', re.S)
_GIT = re.compile(r'set\(\s*TRITON_GIT\s+"(?P<url>[^"]+)"\s*\)')
_TAG = re.compile(r'set\(\s*TRITON_KERNELS_TAG\s+"(?P<tag>[^"]+)"\s*\)')
_GITHUB = re.compile(r"^https://github\.com/(?P<owner>[\w.-]+)/(?P<repo>[\w.-]+?)(?:\.git)?/?$")


def cmake_text(sdist: Path, version: str) -> str | None:
    """The release's triton_kernels.cmake, or None for a release that fetches no triton_kernels."""
    member = f"vllm-{version}/{CMAKE_FILE}"
    try:
        with tarfile.open(sdist, "r:gz") as archive:
            try:
                info = archive.getmember(member)
            except KeyError:
                return None
            handle = archive.extractfile(info) if info.isfile() else None
            return handle.read().decode(errors="replace") if handle else None
    except tarfile.TarError as err:
        raise LockError(f"cannot read vllm-{version}.tar.gz: {err}", "delete it from the cache and re-lock") from None


def source_of(text: str, where: str) -> tuple[str, str, str]:
    """``(owner, repo, commit)`` a ROCm build clones: the ``rocm`` branch's, else the file's only pair."""
    branch = _ROCM_BRANCH.search(text)
    body = branch["body"] if branch else text
    git, tag = _GIT.search(body), _TAG.search(body)
    github = _GITHUB.match(git["url"]) if git else None
    if git is None or tag is None or github is None:
        raise LockError(
            f"cannot read the triton_kernels repository and commit of a ROCm build from {where}",
            "this vLLM release fetches triton_kernels in a way the lock does not know: report it",
        )
    return github["owner"], github["repo"], tag["tag"]


def lock_archive(
    recipe: TritonKernels, sdist: Path, version: str, fetcher: Fetcher, mirror: str | None
) -> Artifact | None:
    """Pin the archive of the commit the release's ROCm build would clone (None if it clones nothing)."""
    text = cmake_text(sdist, version)
    if text is None:
        return None
    owner, repo, commit = source_of(text, f"{CMAKE_FILE} of vLLM {version}")
    fields = {"owner": owner, "repo": repo, "commit": commit}
    url, filename = recipe.url.format(**fields), recipe.filename.format(**fields)
    fetcher.reporter.note(f"lock   triton_kernels: {owner}/{repo} at {commit[:12]} ({url})")
    pending = Artifact(ROLE, filename, url, "")
    return fetcher.measure(ROLE, filename, url, mirror_source(mirror, pending) if mirror else None)


def extract_package(archive: Path, filename: str, package: str, dest: Path) -> Path:
    """Extract ``<top>/<package>/`` of a source archive (one top directory, as GitHub's are) into
    ``dest``; returns the package directory, which holds ``__init__.py``."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            tops = {PurePosixPath(m.name).parts[0] for m in tar.getmembers() if PurePosixPath(m.name).parts}
            if len(tops) != 1:
                raise UnsafeArchiveError(f"{filename} has {len(tops)} top directories, not one", "re-lock")
            (top,) = tops
        with tarfile.open(archive, "r:*") as tar:
            prefix = f"{package}/"
            safe_extract(tar, dest, filename, top=top, select=lambda name, member: name.startswith(prefix))
    except tarfile.TarError as err:
        raise UnsafeArchiveError(f"cannot read {filename}: {err}", "fetch it again") from None
    found = dest / package
    if not (found / "__init__.py").is_file():
        raise UnsafeArchiveError(f"{filename} has no {package}/__init__.py", "check the lock's triton-kernels archive")
    return found
