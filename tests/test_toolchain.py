"""The bundle's C toolchain (issue #22): the locked ziglang, the ``libexec/vllm-bundle/cc`` wrapper the
launcher exports as ``CC``, the root stage and tier 0 checks of it, and the proof: Triton's own C built
with the real zig the way Triton builds it, in a chroot of the image's base that has no compiler, libc
headers, crt objects or linker, with a read-only bundle, then loaded by the bundle's python."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

from tests.conftest import (
    FIXTURE_PLATFORM,
    REPO,
    assert_one_line_error,
    bundle_args,
    copy_recipes,
    lock_against,
    run_cli,
    small_disk,
)
from tests.upstream.fixture import PYTHON_MINOR, Fixture
from tests.upstream.pypi import STAND_IN_ZIG, ZIGLANG_STAND_IN
from tests.upstream.real_wheels import ZIGLANG
from tests.upstream.registry import base_rootfs
from tests.upstream.server import UpstreamServer
from vllm_bundle.errors import AssembleError
from vllm_bundle.inputs.lockfile import read_lock
from vllm_bundle.qualify.tier0 import QualifyRules, check_relocated_smoke, check_toolchain
from vllm_bundle.recipes import load_recipes
from vllm_bundle.tree.assemble import root_stage
from vllm_bundle.tree.stage import StageResult
from vllm_bundle.tree.toolchain import WRAPPER, ZIG, render_wrapper, write_wrapper, zig_target
from vllm_bundle.util.elf import dynamic_info

SITE = f"lib/python{PYTHON_MINOR}/site-packages"
RECIPES = load_recipes(REPO / "recipes")
TARGET = zig_target(RECIPES.python)  # x86_64-linux-gnu.2.35
UID = os.getuid()
# Stands in for zig: says which cache directory and arguments the wrapper gave it.
REPORTING_ZIG = '#!/bin/sh\nprintf "%s\\n" "$ZIG_GLOBAL_CACHE_DIR" "$@"\n'


# -- the recipe and the lock ---------------------------------------------------------------------------


def test_the_target_is_the_glibc_floor_of_the_recipes_platform(recipes_dir: Path) -> None:
    assert TARGET == "x86_64-linux-gnu.2.35", "python.platform x86_64-manylinux_2_35"
    components = recipes_dir / "components.toml"
    components.write_text(components.read_text().replace(FIXTURE_PLATFORM, "x86_64-manylinux_2_28"))
    assert zig_target(load_recipes(recipes_dir).python) == "x86_64-linux-gnu.2.28"


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        (f'c = "ziglang=={ZIGLANG_STAND_IN}"', 'c = "ziglang>=0.17"', "toolchain.c"),
        (f'c = "ziglang=={ZIGLANG_STAND_IN}"', 'c = "gcc==14.2"', "toolchain.c"),
        (f'c = "ziglang=={ZIGLANG_STAND_IN}"', "c = \"ziglang==0.17.1; python_version < '3'\"", "toolchain.c"),
        ("[toolchain]\n", "[toolchains]\n", "toolchain"),
        (f'platform = "{FIXTURE_PLATFORM}"', 'platform = "linux"', "python.platform"),
    ],
)
def test_a_bad_toolchain_or_platform_is_one_line(recipes_dir: Path, old: str, new: str, where: str) -> None:
    components = recipes_dir / "components.toml"
    text = components.read_text()
    assert old in text
    components.write_text(text.replace(old, new, 1))
    result = run_cli("lock", "--check", "gfx1151", "--recipes", recipes_dir)
    assert_one_line_error(result, "bad recipe components.toml: ", f"{where} is ", ", not ")


def test_the_lock_pins_the_toolchain_like_every_wheel(locked: Path, fixture_tree: Fixture) -> None:
    _, pylock = read_lock(locked / "locks", "stable", "gfx1151")
    (package,) = [p for p in pylock["packages"] if p["name"] == "ziglang"]
    (wheel,) = package["wheels"]
    assert package["version"] == ZIGLANG_STAND_IN, "the shared test recipes pin the stand-in"
    assert "marker" not in package, "in the bundle, not only in the build group"
    filename = wheel["url"].rsplit("/", 1)[-1]
    assert wheel["hashes"]["sha256"] == fixture_tree.sha256(filename)
    assert wheel["size"] == fixture_tree.files[filename].stat().st_size
    assert ZIGLANG.filename in fixture_tree.files, "the real wheel is served beside it"


# -- the wrapper ---------------------------------------------------------------------------------------


def wrapper_root(where: Path, zig: str = REPORTING_ZIG) -> Path:
    """A bundle root with the production wrapper and ``zig`` where the ziglang wheel puts it."""
    (where / SITE / "ziglang").mkdir(parents=True)
    (where / SITE / ZIG).write_text(zig)
    (where / SITE / ZIG).chmod(0o755)
    (where / "bin").mkdir(exist_ok=True)  # a test's own bundle may have made it
    python = where / "bin" / f"python{PYTHON_MINOR}"
    if not python.is_symlink():
        python.symlink_to(sys.executable)  # the bundle's interpreter
    write_wrapper(where, render_wrapper(PYTHON_MINOR, TARGET))
    return where


def run_wrapper(wrapper: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {"PATH": "/usr/bin:/bin", **env}
    return subprocess.run([str(wrapper), *args], env=full, capture_output=True, text=True, timeout=30, check=False)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return wrapper_root(tmp_path / "a bundle with spaces")


def test_the_wrapper_runs_the_bundles_zig_cc_for_the_target(root: Path) -> None:
    result = run_wrapper(root / WRAPPER, {"ZIG_GLOBAL_CACHE_DIR": "/c"}, "x.c", "-o", "a b.so", "-I/p q")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["/c", "cc", "-target", TARGET, "x.c", "-o", "a b.so", "-I/p q"]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"ZIG_GLOBAL_CACHE_DIR": "/mine", "XDG_CACHE_HOME": "/xdg", "HOME": "{home}"}, "/mine"),
        ({"XDG_CACHE_HOME": "/xdg", "HOME": "{home}"}, "/xdg/vllm-bundle/zig"),
        ({"XDG_CACHE_HOME": "relative", "HOME": "{home}"}, "{home}/.cache/vllm-bundle/zig"),
        ({"HOME": "{home}"}, "{home}/.cache/vllm-bundle/zig"),
        ({"HOME": "{home}/missing"}, "{tmp}/vllm-bundle-zig-{uid}"),
        ({"HOME": ""}, "{tmp}/vllm-bundle-zig-{uid}"),
        ({}, "{tmp}/vllm-bundle-zig-{uid}"),
    ],
)
def test_the_zig_cache_goes_where_it_can_be_written(
    root: Path, tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    values = {"home": str(tmp_path / "home"), "tmp": str(tmp_path / "tmp"), "uid": str(UID)}
    (tmp_path / "home").mkdir()
    (tmp_path / "tmp").mkdir()
    given = {"TMPDIR": values["tmp"], **{k: v.format(**values) for k, v in env.items()}}
    result = run_wrapper(root / WRAPPER, given)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == expected.format(**values)


def test_a_read_only_home_sends_the_cache_to_tmp(root: Path, tmp_path: Path) -> None:
    with small_disk(tmp_path / "ro-home", "1m", read_only=True) as home:
        result = run_wrapper(root / WRAPPER, {"HOME": str(home), "TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"{tmp_path}/vllm-bundle-zig-{UID}"


def test_another_users_cache_in_tmp_is_refused(root: Path, tmp_path: Path) -> None:
    planted = tmp_path / f"vllm-bundle-zig-{UID}"
    planted.mkdir()
    os.chown(planted, UID + 1, -1)  # as root (the suite is): another user created it first
    result = run_wrapper(root / WRAPPER, {"TMPDIR": str(tmp_path)})
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == f"vllm-bundle cc: {planted} belongs to another user; set ZIG_GLOBAL_CACHE_DIR"


def _link_to_a_folder_this_user_owns(planted: Path, tmp: Path) -> None:
    (tmp / "mine").mkdir(mode=0o700)
    planted.symlink_to(tmp / "mine")
    os.lchown(planted, UID + 1, -1)  # another user's link: -O on it asks about the folder it points to


def _link_to_tmpdir_itself(planted: Path, tmp: Path) -> None:
    planted.symlink_to(tmp)  # for root, the world-writable TMPDIR passes -O
    os.lchown(planted, UID + 1, -1)


def _dangling_link(planted: Path, tmp: Path) -> None:
    planted.symlink_to(tmp / "made later")  # zig would make it, inside a folder another user chose


def _own_link_to_own_folder(planted: Path, tmp: Path) -> None:
    (tmp / "mine").mkdir(mode=0o700)
    planted.symlink_to(tmp / "mine")


def _writable_by_everyone(planted: Path, tmp: Path) -> None:
    planted.mkdir()
    planted.chmod(0o777)


def _writable_by_the_group(planted: Path, tmp: Path) -> None:
    planted.mkdir()
    planted.chmod(0o770)


def _a_file(planted: Path, tmp: Path) -> None:
    planted.write_text("")


@pytest.mark.parametrize(
    ("plant", "why"),
    [
        (_link_to_a_folder_this_user_owns, "is a symbolic link"),
        (_link_to_tmpdir_itself, "is a symbolic link"),
        (_dangling_link, "is a symbolic link"),
        (_own_link_to_own_folder, "is a symbolic link"),
        (_writable_by_everyone, "can be written by others (mode 0777)"),
        (_writable_by_the_group, "can be written by others (mode 0770)"),
        (_a_file, "is not a directory"),
    ],
)
def test_an_unsafe_cache_in_tmp_is_refused_before_zig_runs(
    root: Path, tmp_path: Path, plant: Callable[[Path, Path], None], why: str
) -> None:
    """zig keeps the objects Triton links into its modules in this cache: in the shared TMPDIR only a real
    folder of this user's that no one else can write will do (issue #32)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)  # as /tmp
    planted = tmp / f"vllm-bundle-zig-{UID}"
    plant(planted, tmp)
    result = run_wrapper(root / WRAPPER, {"TMPDIR": str(tmp)})
    assert (result.returncode, result.stdout) == (1, ""), "zig never ran"
    assert result.stderr.strip() == f"vllm-bundle cc: {planted} {why}; set ZIG_GLOBAL_CACHE_DIR"
    assert not (tmp / "made later").exists()


def test_a_missing_tmpdir_is_one_line(root: Path, tmp_path: Path) -> None:
    cache = tmp_path / "missing" / f"vllm-bundle-zig-{UID}"
    result = run_wrapper(root / WRAPPER, {"TMPDIR": str(cache.parent)})
    assert (result.returncode, result.stdout) == (1, ""), "zig never ran"
    assert result.stderr.strip() == (
        f"vllm-bundle cc: {cache} cannot be made (No such file or directory); set ZIG_GLOBAL_CACHE_DIR"
    )


def test_the_cache_in_tmp_is_made_private(root: Path, tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    result = run_wrapper(root / WRAPPER, {"TMPDIR": str(tmp)})
    assert result.returncode == 0, result.stderr
    made = tmp / f"vllm-bundle-zig-{UID}"
    assert result.stdout.splitlines()[0] == str(made)
    info = made.lstat()
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == UID
    assert stat.S_IMODE(info.st_mode) == 0o700, "made by the wrapper, for this user only, before zig writes"


def test_a_private_cache_in_tmp_is_reused(root: Path, tmp_path: Path) -> None:
    cache = tmp_path / f"vllm-bundle-zig-{UID}"
    (cache / "o").mkdir(parents=True)
    (cache / "o" / "libc.so").write_text("kept")
    cache.chmod(0o755)  # others may read it, not write it
    for _ in range(2):
        result = run_wrapper(root / WRAPPER, {"TMPDIR": str(tmp_path)})
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0] == str(cache)
    assert (cache / "o" / "libc.so").read_text() == "kept"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o755


def test_the_wrapper_finds_its_bundle_through_symlinks(root: Path, tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "hop").symlink_to(root / WRAPPER)
    (tmp_path / "bin" / "cc").symlink_to("hop")
    result = run_wrapper(tmp_path / "bin" / "cc", {"ZIG_GLOBAL_CACHE_DIR": "/c"}, "x.c")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:] == ["cc", "-target", TARGET, "x.c"]


# -- the root stage and tier 0 ---------------------------------------------------------------------------


def _root_stage(app: Path, out: Path) -> StageResult:
    vllm = RECIPES.vllm
    return root_stage(
        StageResult("app", app, "app-key", True, 0.0, {}),
        PYTHON_MINOR,
        vllm.attention_rule(),
        vllm.server_rule(),
        vllm.version,
        "gfx1151",
        "template-key",
        out.parent,
        out=out,
        zig_target=TARGET,
    )


def test_the_root_stage_refuses_a_bundle_without_its_toolchain(tmp_path: Path) -> None:
    app = tmp_path / "app"
    (app / SITE).mkdir(parents=True)
    (app / "bin").mkdir()
    with pytest.raises(AssembleError) as caught:
        _root_stage(app, tmp_path / "root")
    assert str(caught.value) == (
        f"the bundle has no C toolchain: site-packages/{ZIG} is missing (Triton compiles C at first GPU use) "
        "(lock again: recipes/components.toml [toolchain] c pins ziglang, which the lock adds to the wheels)"
    )
    assert not (tmp_path / "root").exists()
    wrapper_root(app)
    (app / WRAPPER).unlink()
    built = _root_stage(app, tmp_path / "root")
    assert os.access(built.path / WRAPPER, os.X_OK)
    assert 'CC="$root/libexec/vllm-bundle/cc"' in (built.path / "bin" / "vllm-server").read_text()


def test_tier0_checks_the_wrapper_and_the_zig_it_runs(root: Path) -> None:
    from vllm_bundle.tree.layout import Layout

    passed = check_toolchain(Layout(root, PYTHON_MINOR))
    assert passed.passed, passed.problems
    assert passed.summary == (
        f"{WRAPPER} (the launcher's CC) executable; the zig it runs ({SITE}/{ZIG} cc -target {TARGET}) present"
    )
    (root / SITE / ZIG).chmod(0o644)
    (root / WRAPPER).chmod(0o644)
    failed = check_toolchain(Layout(root, PYTHON_MINOR))
    assert failed.problems == [
        f"{WRAPPER} is not executable",
        f"{SITE}/{ZIG}, which {WRAPPER} runs, is missing or not executable (the [toolchain] wheel)",
    ]
    (root / WRAPPER).write_text((root / WRAPPER).read_text().replace(f" -target {TARGET}", ""))
    assert check_toolchain(Layout(root, PYTHON_MINOR)).problems[-1] == f"{WRAPPER} runs zig cc without -target"


@pytest.fixture
def tiny_bundle(tmp_path: Path) -> Iterator[Path]:
    """A bundle of this machine's python (through a link: it finds its prefix from it), its headers and
    the stand-in zig (this machine's cc): what tier 0's relocated compile needs, in milliseconds."""
    root = wrapper_root(tmp_path / "tiny", STAND_IN_ZIG.decode())
    python = root / "bin" / f"python{PYTHON_MINOR}"
    python.unlink()  # the resolved interpreter: it finds its prefix from the link
    python.symlink_to(Path(sys.executable).resolve())
    (root / "include").mkdir()
    (root / "include" / f"python{PYTHON_MINOR}").symlink_to(sysconfig.get_paths()["include"])
    yield root


def test_tier0_builds_a_c_extension_with_the_moved_bundles_cc(tiny_bundle: Path) -> None:
    from vllm_bundle.tree.layout import Layout

    rules = QualifyRules(frozenset(), (), ("json",), platform="x86_64-manylinux_2_35")
    passed = check_relocated_smoke(Layout(tiny_bundle, PYTHON_MINOR), rules)
    assert passed.passed, passed.problems
    assert passed.summary == "moved elsewhere, imports json; its CC builds a C extension it loads"
    zig = tiny_bundle / SITE / ZIG
    no_headers = "echo \"x.c:1:10: fatal error: 'stdio.h' file not found\"; echo '1 error generated.'"
    zig.write_text(STAND_IN_ZIG.decode().replace('exec cc "$@"', f"{{ {no_headers}; }} >&2; exit 1"))
    failed = check_relocated_smoke(Layout(tiny_bundle, PYTHON_MINOR), rules)
    assert failed.problems == [
        "the bundle's CC could not build a C extension: x.c:1:10: fatal error: 'stdio.h' file not found"
    ]


# -- the proof: the real zig, Triton's C, a chroot without a toolchain -------------------------------------


@pytest.fixture(scope="module")
def real_bundle(_server: UpstreamServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle whose lock pins the production toolchain, the real ziglang 0.17.1 (the bundle tree only).
    Its vLLM is built Python-only, on request: these tests are about the C toolchain the bundle carries,
    and vLLM's own ROCm build (in every other bundle of the suite) would add a build of its kernels
    against this site stage to each run."""
    work = tmp_path_factory.mktemp("real-toolchain")
    recipes = copy_recipes(work / "recipes", real_toolchain=True)
    locked = lock_against(_server, recipes, "gfx1151", work / "lock-cache")
    assert locked.returncode == 0, locked.stderr
    began = time.monotonic()
    args = bundle_args(recipes, _server, work / "build", work / "cache")
    result = run_cli(*args, "--no-archive", "--python-only-vllm", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    root = work / "build" / "gfx1151" / "root"
    zig_bytes = sum(p.stat().st_size for p in (root / SITE / "ziglang").rglob("*") if p.is_file())
    print(
        f"\nbundle build with the real ziglang: {time.monotonic() - began:.1f} s; ziglang {zig_bytes / 2**20:.0f} MiB"
    )
    return root


@pytest.fixture(scope="module")
def rootfs(real_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's base (fake UBI: sh, coreutils, the system libraries the bundle loads) with the bundle
    at /opt/vllm, Triton 3.6's launcher source and the build probe at /probe."""
    rootfs = base_rootfs(tmp_path_factory.mktemp("chroot") / "rootfs", real_bundle)
    shutil.copytree(real_bundle, rootfs / "opt" / "vllm", symlinks=True, copy_function=os.link)
    (rootfs / "probe").mkdir()
    shutil.copy(REPO / "tests" / "triton_build_probe.py", rootfs / "probe")
    shutil.copy(REPO / "tests" / "data" / "triton" / "launcher_360.c", rootfs / "probe")
    return rootfs


def image_env() -> dict[str, str]:
    """The image's environment: the base's PATH and recipes/image.toml's variables (no HOME: a runtime
    sets one only from /etc/passwd, which an arbitrary OpenShift user has no entry in)."""
    env = tomllib.loads((REPO / "recipes" / "image.toml").read_text())["image"]["env"]
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **env}


#: Run in the new mount namespace before chroot: the bundle read-only, and /dev/null (runtimes mount a /dev).
SETUP = 'M={mount}; $M --bind "$1" "$1" && $M -o remount,bind,ro "$1" && $M --bind /dev/null "$2/dev/null" && '


def in_chroot(rootfs: Path, *command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` in new mount and PID namespaces chrooted to ``rootfs``, /proc mounted (zig finds
    itself there), /dev/null there and the bundle mounted read-only, as a container runtime runs an image."""
    (rootfs / "dev" / "null").touch()
    script = SETUP.format(mount=shutil.which("mount")) + f'shift && exec {shutil.which("chroot")} "$@"'
    namespaces = ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={rootfs / 'proc'}"]
    full = [*namespaces, "sh", "-c", script, "sh", str(rootfs / "opt" / "vllm"), str(rootfs), *command]
    return subprocess.run(full, env=env, capture_output=True, text=True, timeout=600, check=False)


def launcher_cc(rootfs: Path) -> str:
    """The CC the image's entrypoint exports (the fixture's vLLM server prints its environment)."""
    result = in_chroot(rootfs, "/opt/vllm/bin/vllm-server", "--model", "/m", env=image_env())
    assert result.returncode == 0, result.stderr
    cc: str = json.loads(result.stdout)["env"]["CC"]
    return cc


def probe(rootfs: Path, env: dict[str, str], out: str) -> dict:  # type: ignore[type-arg]
    libhip = f"/opt/vllm/{SITE}/_rocm_sdk_core/lib/libamdhip64.so.7"
    (rootfs / out.lstrip("/")).mkdir(parents=True)
    python = f"/opt/vllm/bin/python{PYTHON_MINOR}"
    result = in_chroot(
        rootfs, python, "-P", "/probe/triton_build_probe.py", libhip, "/probe/launcher_360.c", out, env=env
    )
    assert result.returncode == 0, result.stderr
    report: dict = json.loads(result.stdout.splitlines()[-1])  # type: ignore[type-arg]
    return report


def _no_host_toolchain(rootfs: Path) -> list[str]:
    """What of a C toolchain the chroot holds outside the bundle's ziglang."""
    zig = rootfs / "opt" / "vllm" / SITE / "ziglang"
    names = ("ld", "ld.*", "cc", "gcc*", "clang*", "crt*.o", "*crt1.o", "stdio.h", "libc.so", "libc.a")
    found = [
        str(p.relative_to(rootfs))
        for p in rootfs.rglob("*")
        if not p.is_relative_to(zig) and any(fnmatch.fnmatch(p.name, n) for n in names)
    ]
    sdk = f"opt/vllm/{SITE}/_rocm_sdk_core/lib/llvm/bin/"  # the ROCm SDK's GPU compiler: no libc, never CC
    return [p for p in found if not p.startswith(sdk) and p != f"opt/vllm/{WRAPPER}"] + (
        ["usr/include"] if (rootfs / "usr" / "include").exists() else []
    )


def _glibc_versions(path: Path) -> set[str]:
    with path.open("rb") as handle:
        section = ELFFile(handle).get_section_by_name(".gnu.version_r")
        if not isinstance(section, GNUVerNeedSection):
            return set()
        return {aux.name for _, auxiliaries in section.iter_versions() for aux in auxiliaries}


def test_triton_builds_its_c_with_the_bundles_cc_in_a_chroot_without_a_toolchain(rootfs: Path) -> None:
    assert _no_host_toolchain(rootfs) == [], "the base has no compiler, linker, crt objects or libc headers"
    looked = in_chroot(rootfs, "/bin/sh", "-c", "command -v cc gcc ld clang; ls /usr/include", env=image_env())
    assert looked.stdout == "" and looked.returncode != 0, looked.stdout
    cc = launcher_cc(rootfs)
    assert cc == f"/opt/vllm/{WRAPPER}"
    env = {**image_env(), "CC": cc}

    cold = probe(rootfs, env, "/tmp/cold")
    warm = probe(rootfs, env, "/tmp/warm")
    amd = f"/opt/vllm/{SITE}/triton/backends/amd"
    for built in (cold["hip_utils"], warm["hip_utils"]):  # build.py _build's command, word for word
        command, srcdir = built["command"], os.path.dirname(built["command"][1])
        assert command == [
            *(cc, f"{srcdir}/hip_utils.c", "-O3", "-shared", "-fPIC", "-Wno-psabi"),
            *("-o", f"{srcdir}/hip_utils{sysconfig.get_config_var('EXT_SUFFIX')}"),
            *(f"-I{amd}/include", f"-I{srcdir}", f"-I/opt/vllm/include/python{PYTHON_MINOR}"),
        ]
        assert built["signature"] == "010104" and built["arg_kernel"] == 1, "hip_utils imported and works"
    assert cold["launcher"]["functions"] == ["launch"], "Triton 3.6's launcher imported"
    assert (rootfs / "tmp" / ".cache" / "vllm-bundle" / "zig").is_dir(), "the zig cache under XDG_CACHE_HOME"
    print(
        f"\nhip_utils: cold {cold['hip_utils']['seconds']:.2f} s, warm {warm['hip_utils']['seconds']:.2f} s; "
        f"launcher: cold {cold['launcher']['seconds']:.2f} s, warm {warm['launcher']['seconds']:.2f} s"
    )
    for so in [rootfs / Path(b["so"]).relative_to("/") for b in (cold["hip_utils"], cold["launcher"])]:
        info = dynamic_info(so)
        assert info is not None and set(info.needed) <= {"libc.so.6", "libm.so.6", "libdl.so.2"}, so
        assert all(v <= (2, 35) for v in (tuple(map(int, n[6:].split("."))) for n in _glibc_versions(so))), so

    written = in_chroot(rootfs, "/bin/sh", "-c", "echo x > /opt/vllm/x", env=image_env())
    assert "Read-only file system" in written.stderr, "the bundle was read-only throughout"


def test_the_bundles_cc_works_with_no_home_and_no_cache_variable(rootfs: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "CC": f"/opt/vllm/{WRAPPER}"}
    report = probe(rootfs, env, "/tmp/no-home")
    assert report["hip_utils"]["signature"] == "010104"
    cache = (rootfs / "tmp" / f"vllm-bundle-zig-{UID}").lstat()
    assert stat.S_ISDIR(cache.st_mode), "zig's cache went to /tmp, per user"
    assert stat.S_IMODE(cache.st_mode) == 0o700, "made private by the bundle's python, in a base without stat"


def test_tier0_built_a_c_extension_with_the_real_zig(real_bundle: Path) -> None:
    report = json.loads((real_bundle.parent / "qualify" / "qualification.json").read_text())
    checks = {check["name"]: check for check in report["checks"]}
    fixture_target = "x86_64-linux-gnu." + FIXTURE_PLATFORM.split("manylinux_")[1].replace("_", ".")  # its floor
    assert checks["c-toolchain"]["passed"] and f"cc -target {fixture_target}" in checks["c-toolchain"]["summary"]
    assert checks["relocated-smoke"]["passed"], checks["relocated-smoke"]["problems"]
