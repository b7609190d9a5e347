"""Where the vllm-wheel stage runs vLLM's build: inside a builder image pinned by digest (recipes/builder.toml,
locks/builder.json), or on this machine when that is asked for (``bundle --no-builder``).

The build machine is an input like any other: its glibc and libstdc++ become the floor of every file the
build compiles (qualify/floor.py), its compilers and tools decide the bytes. So by default the build runs in
the image's root file system, unpacked once per image digest (the ``builder`` stage, in the download
cache beside the blobs it is made from, shared by every build that uses it) and mounted read-only as
``/`` by bubblewrap, with no network; only the stage's own directories are mounted from this machine, at
the paths they have here, so every path the build names is the one it has on this machine. The
environment is the image's own (its config's ``Env``) with the build's variables over it, and the PATH is
the stage's tools, then the image's.

Bubblewrap, not a container engine: it runs unprivileged where unprivileged user namespaces are allowed,
on a laptop and on GitHub's runners alike (docs/building-rocm.md, "Where vLLM is compiled"); Debian's
podman cannot start a container on the machines this project is tested on (crun: ``setrlimit
RLIMIT_NOFILE: Operation not permitted``) and hosted runners start no engine inside a job's sandbox.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from vllm_bundle.errors import BuildError
from vllm_bundle.tree.stage import StageResult, run_stage
from vllm_bundle.util.layers import apply_layers

STAGE_VERSION = 1
ROOTFS = "rootfs"
#: Top-level directories of the image the sandbox makes its own: a new /dev and /proc, an empty /tmp.
SANDBOX_OWN = ("dev", "proc", "sys", "tmp")
BWRAP = "bwrap"
BWRAP_HINT = (
    "install bubblewrap (apt-get install bubblewrap); where unprivileged user namespaces are off (Ubuntu 24.04: "
    "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0), allow them, or build on this machine "
    "with --no-builder"
)
#: Prints what the build needs of its builder, one ``key=value`` line each: the host compilers (found on
#: the builder's PATH, as $1 and $2 name them), whether g++ finds libstdc++'s headers, GNU patch, glibc.
#: Shell builtins only, beside the programs it asks about (and getconf): a PATH that lacks coreutils
#: still gets an answer that names what is missing.
PROBE = r"""
first() { IFS= read -r line; printf '%s' "$line"; }
first_error() {
    while IFS= read -r line; do case $line in *rror*) printf '%s' "$line"; return ;; esac; done
}
cc=$(command -v "$1" || true); cxx=$(command -v "$2" || true); patch=$(command -v patch || true)
echo "cc=$cc"; echo "cxx=$cxx"; echo "patch=$patch"
[ -n "$cxx" ] && echo "cxx_version=$("$cxx" --version 2>/dev/null | first)"
if [ -n "$cxx" ]; then
    if err=$(printf '#include <string>\n' | "$cxx" -x c++ -E -o /dev/null - 2>&1); then
        echo "cxx_headers=yes"
    else
        echo "cxx_headers=$(printf '%s\n' "$err" | first_error)"
    fi
fi
[ -n "$patch" ] && echo "patch_version=$("$patch" --version 2>/dev/null | first)"
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null || true)
echo "glibc=${glibc#glibc }"
"""


@dataclass(frozen=True)
class ImageFiles:
    """A builder image as the pipeline fetched it: its reference and manifest digest, its config's
    environment, and its layers (media type, cached blob), lowest first."""

    reference: str
    digest: str
    env: tuple[str, ...]
    layers: tuple[tuple[str, Path], ...]


def rootfs_stage(image: ImageFiles, *, out: Path, force: bool = False) -> StageResult:
    """Stage ``builder``: the image's layers applied to ``out/rootfs`` (util/layers.py)."""

    def build(tmp: Path) -> Mapping[str, Any]:
        entries = apply_layers(list(image.layers), tmp / ROOTFS, f"the builder image {image.reference}")
        return {"reference": image.reference, "digest": image.digest, "entries": entries}

    inputs = {"digest": image.digest, "layers": [path.name for _, path in image.layers]}
    return run_stage(out, "builder", STAGE_VERSION, inputs, build, force=force)


@dataclass(frozen=True)
class Tools:
    """What the builder gave the probe: absolute paths of the host compilers and patch (inside it), the
    first line of ``g++ --version``, and its glibc."""

    cc: str
    cxx: str
    cxx_version: str
    patch: str
    patch_version: str
    glibc: str

    def record(self) -> dict[str, str]:
        return {"cc": self.cc, "cxx": self.cxx, "cxx_version": self.cxx_version, "glibc": self.glibc}


#: The host compilers recipes/builder.toml names when none is given: GCC's.
DEFAULT_COMPILERS = ("gcc", "g++")


@dataclass(frozen=True)
class Builder:
    """Where the build's commands run: in ``rootfs`` (an unpacked builder image, ``reference`` at
    ``digest`` with its config's environment ``env``), or on this machine when ``rootfs`` is None;
    ``compilers``: the host C and C++ compilers, as found on the builder's PATH."""

    rootfs: Path | None = None
    reference: str = ""
    digest: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    compilers: tuple[str, str] = DEFAULT_COMPILERS

    @classmethod
    def image(cls, stage: StageResult, image: ImageFiles, compilers: tuple[str, str] = DEFAULT_COMPILERS) -> Builder:
        env = dict(item.split("=", 1) for item in image.env if "=" in item)
        return cls(stage.path / ROOTFS, image.reference, image.digest, env, compilers)

    @property
    def on_host(self) -> bool:
        return self.rootfs is None

    def describe(self) -> str:
        return "this machine (--no-builder)" if self.on_host else f"the builder image {self.reference}@{self.digest}"

    def path(self) -> list[str]:
        """The builder's own PATH: the image's (its config's), or this machine's."""
        text = os.environ.get("PATH", os.defpath) if self.on_host else self.env.get("PATH", os.defpath)
        return [entry for entry in text.split(os.pathsep) if entry]

    def environment(self) -> dict[str, str]:
        """What every command starts from: the image's environment less its PATH (the build sets its own);
        nothing of this machine's."""
        return {key: value for key, value in self.env.items() if key != "PATH"}

    def command(self, argv: Sequence[str], cwd: Path, writable: Sequence[Path], readable: Sequence[Path]) -> list[str]:
        """``argv`` as run in the builder: as it is on this machine, else under bubblewrap with the image
        read-only as ``/``, ``writable`` and ``readable`` mounted at their own paths, no network."""
        if self.rootfs is None:
            return list(argv)
        bwrap = shutil.which(BWRAP)
        if bwrap is None:
            raise BuildError(f"building in {self.describe()} needs bubblewrap, which is not on PATH", BWRAP_HINT)
        mounts = [Path(p).absolute() for p in (*writable, *readable)]
        command = [bwrap, *_image_mounts(self.rootfs, mounts), "--dev", "/dev", "--proc", "/proc"]
        command += ["--tmpfs", "/tmp"]  # noqa: S108 - the sandbox's own, empty
        for flag, paths in (("--bind", writable), ("--ro-bind", readable)):
            for path in paths:
                command += [flag, str(Path(path).absolute()), str(Path(path).absolute())]
        command += ["--unshare-all", "--die-with-parent", "--new-session", "--chdir", str(cwd.absolute()), "--"]
        return command + list(argv)

    def probe(self, work: Path, *, needs_patch: bool) -> Tools:
        """The host compilers and tools the build takes from the builder, each checked in one line
        (``work``: a scratch directory for the probe)."""
        cc, cxx = self.compilers
        found = self._run_probe(cc, cxx, work)
        where, fix = self._missing_hint()
        for name, key in ((cxx, "cxx"), (cc, "cc")):
            if not found.get(key):
                raise BuildError(f"{where} has no {name}, vLLM's host compiler (GCC, as TheRock's builds use)", fix)
        if found.get("cxx_headers") != "yes":
            raise BuildError(
                f"{where}'s {found['cxx']} cannot compile C++: no libstdc++ headers ({found.get('cxx_headers')})",
                fix.replace(" g++", " g++ (with libstdc++-dev)"),
            )
        if needs_patch:
            version = found.get("patch_version", "")
            if not found.get("patch"):
                raise BuildError(f"vLLM's CMakeLists.txt runs GNU patch; {where} has no patch", fix)
            if "GNU patch" not in version:
                raise BuildError(f"vLLM's CMakeLists.txt runs GNU patch; {where}'s is {version!r}", fix)
        return Tools(
            found["cc"], found["cxx"], found.get("cxx_version", ""), found.get("patch", ""),
            found.get("patch_version", ""), found.get("glibc") or "unknown",
        )  # fmt: skip

    def _missing_hint(self) -> tuple[str, str]:
        if self.on_host:
            return "this machine", "install g++ and GNU patch (apt-get install g++ patch), or drop --no-builder"
        return f"the builder image {self.reference}", "lock a builder image that has them (recipes/builder.toml)"

    def _run_probe(self, cc: str, cxx: str, work: Path) -> dict[str, str]:
        work.mkdir(parents=True, exist_ok=True)
        env = {**self.environment(), "PATH": os.pathsep.join(self.path()), "LC_ALL": "C", "TMPDIR": str(work)}
        command = self.command(["/bin/sh", "-c", PROBE, "probe", cc, cxx], work, [work], [])
        try:
            result = subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise BuildError(f"cannot run the build's probe in {self.describe()}: {err}", BWRAP_HINT) from None
        if result.returncode != 0 or "glibc=" not in result.stdout:
            said = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
            raise BuildError(f"cannot run commands in {self.describe()}: {said}", BWRAP_HINT)
        return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)

    def key(self, tools: Tools | None) -> dict[str, Any]:
        """What of the builder the build's output depends on: the image, or this machine's tools (``tools``:
        its probe; None for a build that compiles nothing)."""
        found = tools.record() | {"patch": tools.patch_version} if tools else {}
        return {"image": self.digest, "compilers": list(self.compilers)} if not self.on_host else {"host": found}

    def record(self, tools: Tools | None) -> dict[str, Any]:
        """How the build's machine is recorded (release.json): the image by digest, or this machine."""
        where = {"image": f"{self.reference}@{self.digest}"} if not self.on_host else {"host": True}
        return where | (tools.record() if tools else {})


def _image_mounts(rootfs: Path, mounts: Sequence[Path]) -> list[str]:
    """bubblewrap's arguments that make ``rootfs`` the sandbox's ``/``, read-only, leaving room for
    ``mounts`` at their own paths: each entry of the image is mounted (a directory or file read-only, a
    symlink as a symlink), except those a mount lies in, which become empty directories whose entries are
    mounted the same way. The image itself is never written to (it is a finished stage)."""
    args: list[str] = []

    def visit(inside: PurePosixPath, wanted: list[PurePosixPath]) -> None:
        for entry in sorted((rootfs / inside).iterdir()):
            name = entry.name
            child = inside / name
            if not inside.parts and name in SANDBOX_OWN:
                continue
            host = rootfs / child
            below = [path for path in wanted if path == child or child in path.parents]
            if child in below:
                continue  # the mount from this machine stands there
            if not below:
                args.extend(["--symlink", str(host.readlink())] if host.is_symlink() else ["--ro-bind", str(host)])
                args.append(f"/{child}")
            elif host.is_symlink() or not host.is_dir():
                raise BuildError(
                    f"{below[0]} cannot be mounted in the builder: /{child} is not a directory in the image",
                    "pass --build-dir (and --cache-dir) elsewhere",
                )
            else:
                args.extend(["--dir", f"/{child}"])
                visit(child, below)

    wanted = [PurePosixPath(*path.parts[1:]) for path in mounts]
    for path in wanted:
        if path.parts and path.parts[0] in ("proc", "sys"):
            raise BuildError(f"/{path} cannot be mounted in the builder", "pass --build-dir elsewhere")
    visit(PurePosixPath(), wanted)
    return args
