"""Where vLLM is compiled (tree/builder.py, util/layers.py, oci/builder.py): a builder image's layers applied
to a root file system, safely, whatever they hold; bubblewrap's mounts of it; the probe of what the build
takes from its builder, each missing piece one line; and the builder images of the fixture
(tests/upstream/builders.py) running real builds."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO, assert_one_line_error, bundle_cli, publish_builders, run_cli, seed_vllm_build
from tests.upstream.builders import TAGS
from tests.upstream.fixture import PYTHON_MINOR, Fixture
from tests.upstream.registry import RegistryServer
from tests.upstream.server import UpstreamServer
from vllm_bundle.errors import BuildError, UnsafeArchiveError
from vllm_bundle.tree.builder import Builder, _image_mounts
from vllm_bundle.util.layers import PLAIN_TYPES, apply_layers

LAYER = PLAIN_TYPES[0]


def _layer(path: Path, entries: list[tuple[str, str, object]]) -> Path:
    """A layer tar of (name, kind, what): file (bytes, or (bytes, mode)), dir, symlink (target), hardlink
    (target), chr (a device node), fifo."""
    with tarfile.open(path, "w") as tar:
        for name, kind, what in entries:
            info = tarfile.TarInfo(name)
            data = b""
            if kind == "file":
                data, info.mode = what if isinstance(what, tuple) else (what, 0o644)
                info.size = len(data)
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, str(what)
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, str(what)
            elif kind == "chr":
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, io.BytesIO(data) if kind == "file" else None)
    return path


def test_layers_are_applied_in_order_with_their_whiteouts(tmp_path: Path) -> None:
    """OCI's changeset rules (image-spec layer.md): a later layer replaces, ``.wh.<name>`` removes what a
    layer below put there, ``.wh..wh..opq`` empties a directory of it; a root file system's absolute
    symlinks are kept (they are read inside the sandbox); setuid bits, device nodes and FIFOs are not."""
    base = _layer(
        tmp_path / "base.tar",
        [
            ("usr", "dir", None),
            ("usr/bin", "dir", None),
            ("usr/bin/su", "file", (b"su", 0o4755)),
            ("usr/bin/gone", "file", b"removed by the next layer"),
            ("usr/lib", "dir", None),
            ("usr/lib/libc.so.6", "file", b"libc"),
            ("lib", "symlink", "usr/lib"),
            ("lib64", "dir", None),
            ("lib64/ld-linux-x86-64.so.2", "symlink", "/lib/ld.so"),
            ("etc", "dir", None),
            ("etc/old", "file", b"hidden by the opaque whiteout"),
            ("dev", "dir", None),
            ("dev/null", "chr", None),
            ("run", "dir", None),
            ("run/pipe", "fifo", None),
            ("opt", "file", b"a file the next layer makes a directory"),
        ],
    )
    top = _layer(
        tmp_path / "top.tar",
        [
            ("usr/bin/.wh.gone", "file", b""),
            ("usr/bin/sudo", "hardlink", "usr/bin/su"),
            ("etc", "dir", None),
            ("etc/new", "file", b"kept: this layer's own"),
            ("etc/.wh..wh..opq", "file", b""),
            ("opt", "dir", None),
            ("opt/tool", "file", (b"#!/bin/sh\n", 0o755)),
        ],
    )
    root = tmp_path / "rootfs"
    apply_layers([(LAYER, base), (LAYER, top)], root, "the test image")
    assert not (root / "usr/bin/gone").exists() and (root / "usr/bin/su").read_bytes() == b"su"
    assert os.stat(root / "usr/bin/su").st_mode & 0o7777 == 0o755, "setuid dropped"
    assert os.stat(root / "usr/bin/sudo").st_ino == os.stat(root / "usr/bin/su").st_ino, "a hard link"
    assert (root / "lib").readlink() == Path("usr/lib") and (root / "lib64/ld-linux-x86-64.so.2").readlink() == Path(
        "/lib/ld.so"
    ), "symlinks as they are, absolute ones too"
    assert sorted(p.name for p in (root / "etc").iterdir()) == ["new"], "the opaque whiteout hid the layer below"
    assert not (root / "dev/null").exists() and not (root / "run/pipe").exists(), "no device node, no FIFO"
    assert (root / "opt").is_dir() and stat.S_IMODE(os.stat(root / "opt/tool").st_mode) == 0o755


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([("../escape", "file", b"x")], "has a '..' component"),
        ([("/etc/passwd", "file", b"x")], "has an absolute path"),
        (
            [("lib", "symlink", "/tmp"), ("lib/x", "file", b"x")],
            "lies below lib, a symlink: it would be written through",
        ),
        ([("lib", "symlink", "usr/lib"), ("lib/x", "file", b"x")], "lies below lib, a symlink"),
        ([("a", "file", b"x"), ("a/b", "file", b"y")], "lies below a, which is not a directory"),
        ([("link", "hardlink", "etc/shadow")], "is a hard link to etc/shadow, which is not a file written before it"),
        ([("s", "symlink", "/etc/hostname"), ("h", "hardlink", "s")], "is a hard link to s, which is not a file"),
        ([("d", "symlink", ".."), ("d/.wh.x", "file", b"")], "lies below d, a symlink"),
    ],
)
def test_a_layer_that_would_write_outside_or_through_a_link_is_refused(
    tmp_path: Path, entries: list[tuple[str, str, object]], why: str
) -> None:
    root, outside = tmp_path / "rootfs", tmp_path / "outside"
    outside.mkdir()
    layer = _layer(tmp_path / "evil.tar", entries)
    with pytest.raises(UnsafeArchiveError) as refused:
        apply_layers([(LAYER, layer)], root, "the test image")
    assert why in str(refused.value) and "refusing to unpack the test image layer 1 of 1" in str(refused.value)
    assert list(outside.iterdir()) == [] and not (tmp_path / "escape").exists(), "nothing written outside"


def test_a_layer_of_an_unknown_media_type_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UnsafeArchiveError, match="a layer of media type 'application/x-rar' cannot be unpacked"):
        apply_layers([("application/x-rar", _layer(tmp_path / "l.tar", []))], tmp_path / "rootfs", "the image")


def test_the_image_is_mounted_entry_by_entry_around_the_builds_own_directories(tmp_path: Path) -> None:
    """bubblewrap's root is the image, read-only; a directory of this machine's is mounted at its own path,
    so an image directory it lies in becomes an empty one whose other entries are mounted as they are."""
    rootfs = tmp_path / "rootfs"
    for name in ("usr/bin", "opt/rh/bin", "opt/other", "home", "tmp", "dev", "proc"):
        (rootfs / name).mkdir(parents=True)
    (rootfs / "bin").symlink_to("usr/bin")
    args = _image_mounts(rootfs, [Path("/opt/work/build"), Path("/tmp/x"), Path("/dev/shm/y")])
    assert args == [
        "--symlink", "usr/bin", "/bin",
        "--ro-bind", str(rootfs / "home"), "/home",
        "--dir", "/opt",
        "--ro-bind", str(rootfs / "opt/other"), "/opt/other",
        "--ro-bind", str(rootfs / "opt/rh"), "/opt/rh",
        "--ro-bind", str(rootfs / "usr"), "/usr",
    ]  # fmt: skip
    with pytest.raises(BuildError, match="/bin is not a directory in the image"):
        _image_mounts(rootfs, [Path("/bin/build")])
    with pytest.raises(BuildError, match="/proc/x cannot be mounted in the builder"):
        _image_mounts(rootfs, [Path("/proc/x")])


def test_building_in_an_image_without_bubblewrap_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    builder = Builder(tmp_path, "ghcr.io/rocm/therock_build_manylinux_x86_64:latest", "sha256:" + "0" * 64)
    with pytest.raises(BuildError) as refused:
        builder.command(["true"], tmp_path, [], [])
    assert "needs bubblewrap, which is not on PATH" in str(refused.value)
    assert "apt-get install bubblewrap" in str(refused.value) and "--no-builder" in str(refused.value)


# -- the probe: what the build takes from its builder, one line each ----------------------------------------


def _tools(where: Path, **scripts: str) -> Path:
    """A PATH of this machine's gcc, g++, GNU patch and getconf, each replaced by ``scripts`` (a name -> a
    shell script's body, or "" for none)."""
    where.mkdir(parents=True, exist_ok=True)
    for name in ("gcc", "g++", "patch", "getconf"):
        if name in scripts:
            if scripts[name]:
                (where / name).write_text(f"#!/bin/sh\n{scripts[name]}\n")
                (where / name).chmod(0o755)
            continue
        found = shutil.which(name, path="/usr/bin:/bin")
        assert found, f"this machine has {name}"
        (where / name).symlink_to(found)
    return where


def _probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **scripts: str) -> str:
    monkeypatch.setenv("PATH", str(_tools(tmp_path / "bin", **scripts)))
    with pytest.raises(BuildError) as refused:
        Builder().probe(tmp_path / "probe", needs_patch=True)
    return str(refused.value)


def test_this_machines_tools_are_probed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(_tools(tmp_path / "bin")))
    tools = Builder().probe(tmp_path / "probe", needs_patch=True)
    assert (tools.cc, tools.cxx) == (str(tmp_path / "bin" / "gcc"), str(tmp_path / "bin" / "g++"))
    assert tools.cxx_version.startswith("g++ ") and tools.patch_version.startswith("GNU patch ")
    assert tools.glibc == (os.confstr("CS_GNU_LIBC_VERSION") or "").split()[1]


@pytest.mark.parametrize(
    ("scripts", "line"),
    [
        (
            {"g++": ""},
            "this machine has no g++, vLLM's host compiler (GCC, as TheRock's builds use) (install g++ and GNU patch "
            "(apt-get install g++ patch), or drop --no-builder)",
        ),
        (
            {"gcc": ""},
            "this machine has no gcc, vLLM's host compiler (GCC, as TheRock's builds use)",
        ),
        (  # g++ without libstdc++'s headers (a gcc with no libstdc++-dev)
            {"g++": 'exec /usr/bin/g++ -nostdinc++ "$@"'},
            "g++ cannot compile C++: no libstdc++ headers (<stdin>:1:10: fatal error: string: No such file or "
            "directory)",
        ),
        ({"patch": ""}, "vLLM's CMakeLists.txt runs GNU patch; this machine has no patch"),
        (
            {"patch": 'echo "patch 0.9 (BusyBox)"'},
            "vLLM's CMakeLists.txt runs GNU patch; this machine's is 'patch 0.9 (BusyBox)'",
        ),
    ],
)
def test_what_the_build_needs_of_this_machine_is_checked_first_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scripts: dict[str, str], line: str
) -> None:
    assert line in _probe(tmp_path, monkeypatch, **scripts)


def test_a_machine_whose_builder_cannot_run_says_so(tmp_path: Path) -> None:
    """An image without /bin/sh (or where bubblewrap cannot start): one line, how to fix it."""
    rootfs = tmp_path / "rootfs" / "usr"
    rootfs.mkdir(parents=True)
    builder = Builder(rootfs.parent, "example.org/empty:1", "sha256:" + "1" * 64)
    with pytest.raises(BuildError) as refused:
        builder.probe(tmp_path / "probe", needs_patch=False)
    assert str(refused.value).startswith(
        f"cannot run commands in the builder image example.org/empty:1@sha256:{'1' * 64}: "
    )
    assert "bubblewrap" in str(refused.value)


def test_the_builder_record_and_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build in an image is keyed by its digest; one on this machine by the tools it found (a new g++
    rebuilds), and release.json says which."""
    monkeypatch.setenv("PATH", str(_tools(tmp_path / "bin")))
    tools = Builder().probe(tmp_path / "probe", needs_patch=False)
    image = Builder(tmp_path, "ghcr.io/x/y:latest", "sha256:" + "2" * 64, {"PATH": "/usr/bin"})
    assert image.key(tools) == {"image": "sha256:" + "2" * 64, "compilers": ["gcc", "g++"]}
    assert image.record(tools)["image"] == f"ghcr.io/x/y:latest@sha256:{'2' * 64}"
    host = Builder()
    assert host.key(tools)["host"]["cxx_version"] == tools.cxx_version and host.record(tools)["host"] is True
    assert image.path() == ["/usr/bin"] and image.environment() == {}, "the image's PATH; nothing of this machine's"
    assert json.dumps(host.record(None)) == '{"host": true}', "a Python-only build compiles nothing"


# -- the builder decides the floor: the fixture's bundle built in trixie (glibc 2.41) -------------------------


@pytest.fixture(scope="module")
def trixie(
    built: Path,
    locked: Path,
    _server: UpstreamServer,
    builder_registry: RegistryServer,
    fixture_tree: Fixture,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """The suite's gfx1151 bundle with vLLM compiled in a trixie builder instead (recipes/builder.toml naming
    the fixture's other tag), every other stage as the suite's own build made it: tier 0 fails it (the
    fixture claims glibc 2.36), and --warn-only takes it to its release, which records what it needs."""
    publish_builders(builder_registry, fixture_tree, "trixie")
    work = tmp_path_factory.mktemp("trixie")
    recipes = work / "recipes"
    shutil.copytree(locked, recipes)
    (recipes / "locks" / "builder.json").unlink(missing_ok=True)
    builder = recipes / "builder.toml"
    builder.write_text(builder.read_text().replace('_x86_64:latest"', f'_x86_64:{TAGS["trixie"]}"'))
    build = seed_vllm_build(built, work / "build", stages=("python", "site", "vllm-src"))
    result = bundle_cli(recipes, _server, build, built.parent / "cache", "--warn-only", builder=builder_registry)
    assert result.returncode == 0, result.stdout + result.stderr
    return result, build, recipes


def test_vllm_compiled_in_a_newer_builder_needs_its_glibc_and_tier_0_names_it(
    trixie: tuple[subprocess.CompletedProcess[str], Path, Path],
) -> None:
    """vLLM 0.33.0's cumem_allocator.cpp:30 calls strtoull, which trixie's glibc 2.41 headers redirect to
    __isoc23_strtoull (GLIBC_2.38) under _GNU_SOURCE, as g++ compiles it; built in bookworm (the suite's
    own bundle) it needs nothing above 2.36 (test_qualify.py test_fixture_bundle_passes)."""
    result, build, _ = trixie
    states = {line.split()[1]: line.split()[2] for line in result.stdout.splitlines() if line.startswith("stage")}
    assert states["python"] == states["site"] == "cached" and states["vllm-wheel"] == "built"
    report = json.loads((build / "gfx1151" / "qualify" / "qualification.json").read_text())
    (check,) = [c for c in report["checks"] if c["name"] == "symbol-versions"]
    assert not check["passed"]
    assert check["problems"] == [
        f"lib/python{PYTHON_MINOR}/site-packages/vllm/cumem_allocator.abi3.so needs __isoc23_strtoull@GLIBC_2.38 "
        "(libc.so.6): above the floor manylinux_2_36_x86_64 (GLIBC <= 2.36)"
    ]
    assert report["floor"]["glibc"] == "2.38" and report["floor"]["platform"] == "manylinux_2_38_x86_64"
    assert "FAIL symbol-versions" in result.stdout


def test_the_release_records_the_floor_it_has_and_where_vllm_was_compiled(
    trixie: tuple[subprocess.CompletedProcess[str], Path, Path],
) -> None:
    _, build, _ = trixie
    (assets,) = [p for p in (build.parent / "bundles").iterdir() if (p / "release.json").is_file()]
    release = json.loads((assets / "release.json").read_text())
    floor = release["floor"]
    assert (floor["claimed"], floor["glibc"], floor["platform"]) == (
        "x86_64-manylinux_2_36",
        "2.38",
        "manylinux_2_38_x86_64",
    )
    assert floor["highest"]["GLIBC"] == "2.38" and "GLIBCXX" in floor["highest"], floor
    builder = release["vllm_build"]["builder"]
    assert builder["image"].startswith("ghcr.io/rocm/therock_build_manylinux_x86_64:trixie@sha256:")
    assert builder["glibc"] == "2.41" and builder["cxx_version"].startswith("g++ (Debian 14.")
    assert release["qualification"]["tier0"]["checks"]["symbol-versions"] is False
    pins = json.loads((assets / "backend_versions.json").read_text())
    assert pins["glibc"] == {assets.name: "2.38"}, "where an installer that reads no release.json finds it"


def test_without_warn_only_a_bundle_above_its_floor_stops_before_its_release(
    trixie: tuple[subprocess.CompletedProcess[str], Path, Path],
    built: Path,
    _server: UpstreamServer,
    builder_registry: RegistryServer,
    tmp_path: Path,
) -> None:
    _, trixie_build, recipes = trixie
    build = tmp_path / "build"  # a copy: its release directory beside it starts empty
    shutil.copytree(trixie_build, build, symlinks=True)
    result = bundle_cli(recipes, _server, build, built.parent / "cache", builder=builder_registry)
    last = assert_one_line_error(result, "tier 0 qualification failed (1 of 18 checks): symbol-versions: ")
    assert "vllm/cumem_allocator.abi3.so needs __isoc23_strtoull@GLIBC_2.38" in last
    assert "stage  vllm-wheel  cached" in result.stdout, "the same build, only its release refused"
    assert not (tmp_path / "bundles").exists() or not any((tmp_path / "bundles").iterdir())


def test_install_and_doctor_on_an_older_glibc_refuse_naming_both(
    trixie: tuple[subprocess.CompletedProcess[str], Path, Path], tmp_path: Path
) -> None:
    """The release needs glibc 2.38; this machine (Debian 12) has 2.36: one line before any download, not an
    ImportError at the server's first request."""
    _, build, _ = trixie
    (assets,) = [p for p in (build.parent / "bundles").iterdir() if (p / "release.json").is_file()]
    host: list[str | Path] = ["--host-root", REPO / "tests" / "data" / "hosts" / "strix-halo", "--plain"]
    dest, cache = tmp_path / "vllm", tmp_path / "cache"
    refused = run_cli("install", assets, "--dest", dest, "--cache-dir", cache, *host)
    assert_one_line_error(
        refused,
        "this machine cannot run the gfx1151 bundle: this machine has glibc 2.36; the bundle needs glibc 2.38 or "
        "newer (its release)",
    )
    assert not dest.exists() and not cache.exists(), "refused before anything was downloaded"
    forced = run_cli("install", assets, "--dest", dest, "--cache-dir", cache, *host, "--force", timeout=300)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert (dest / ".vllm-bundle-glibc").read_text() == "2.38"
    doctor = run_cli("doctor", "--bundle", dest, *host[:2])
    assert doctor.returncode == 1
    assert f"block glibc   this machine has glibc 2.36; the bundle needs glibc 2.38 or newer (its release, {dest}" in (
        doctor.stdout
    )
