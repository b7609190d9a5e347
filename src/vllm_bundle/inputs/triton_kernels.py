"""The triton_kernels source of vLLM's ROCm build: read, locked, extracted.

vLLM's configure step clones the Triton repository its ``cmake/external_projects/triton_kernels.cmake``
names (for ``VLLM_TARGET_DEVICE=rocm``: ROCm/triton at a pinned commit, vllm-0.33.0) unless the
environment's ``TRITON_KERNELS_SRC_DIR`` points at the ``triton_kernels`` package; then only that
directory's ``*.py`` files are installed into the wheel. The build extracts the package from a locked
archive: no clone, no network.

Which commit: triton_kernels is Triton's own Python package (``python/triton_kernels``) and imports Triton's
internals, so it is taken from the commit the bundle's Triton was built from when that Triton's version
names one (TheRock's are ``3.7.1+git0263a6a6.rocm7.14.0``: Triton's setup.py adds ``+git<8 hex>``, TheRock
the ``.rocm`` part). vLLM 0.33.0 pins 669b31ac of Triton's 3.8 branch, the Triton its own image builds
and swaps into TheRock's torch (docker/Dockerfile.rocm_base:6-7, 263-271); its code reads which
triton_kernels it has (vllm/utils/import_utils.py get_triton_kernels_version) and takes each one's API.
Without a commit in the version, vLLM's pin is locked and tier 0 is what proves the two import together.
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


_TRITON_COMMIT = re.compile(r"\+git(?P<commit>[0-9a-f]{7,40})(?=$|[.-])")


def triton_commit(triton_version: str) -> str | None:
    """The commit a Triton wheel was built from, as its version names it (``3.7.1+git0263a6a6.rocm7.14.0``)."""
    found = _TRITON_COMMIT.search(triton_version)
    return found["commit"] if found else None


def lock_archive(
    recipe: TritonKernels, sdist: Path, version: str, fetcher: Fetcher, mirror: str | None, triton_version: str
) -> Artifact | None:
    """Pin the archive of triton_kernels for the bundle's Triton ``triton_version`` (None if the release's
    ROCm build uses no triton_kernels): the Triton's own commit, else the one vLLM's cmake names."""
    text = cmake_text(sdist, version)
    if text is None:
        return None
    owner, repo, commit = source_of(text, f"{CMAKE_FILE} of vLLM {version}")
    paired = triton_commit(triton_version)
    if paired is not None:
        owner, repo = recipe.triton_repository.split("/")
        fetcher.reporter.note(
            f"lock   triton_kernels: from the bundle's Triton {triton_version}'s own commit (vLLM {version} pins "
            f"{commit[:8]}, its image's Triton)"
        )
        commit = paired
    else:
        fetcher.reporter.note(
            f"lock   triton_kernels: vLLM {version}'s pin; the bundle's Triton {triton_version} names no commit "
            "(tier 0 proves the two import together)"
        )
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
