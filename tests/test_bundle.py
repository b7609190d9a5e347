"""`vllm-bundle bundle` on the fake upstream: a relocatable tree, cached stages, safe extraction,
and crash safety."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error, bundle_args, bundle_cli, tree_digest
from tests.upstream.fixture import PYTHON_MINOR
from tests.upstream.packaging_fixtures import make_wheel
from tests.upstream.registry import RegistryServer
from tests.upstream.server import UpstreamServer
from vllm_bundle.errors import AssembleError, BundleError
from vllm_bundle.pipeline.build import stage_names
from vllm_bundle.tree.assemble import install_wheels
from vllm_bundle.tree.layout import Layout
from vllm_bundle.tree.python_stage import python_stage
from vllm_bundle.tree.stage import StageResult
from vllm_bundle.tree.toolchain import WRAPPER
from vllm_bundle.util.fsutil import sha256_file

#: The stages of a build without --image (the fixture build), in order.
#: The stages the tests here run in a build directory: not the image (no --image here), nor the builder's root
#: file system, which is the download cache's (one for every build; test_builder.py shows it is made whole or
#: not at all).
STAGES = [name for name in stage_names() if name not in ("image", "builder")]


def copy_of(built: Path, dest: Path) -> Path:
    """Running a bundle writes byte code into it: tests run copies and keep the built tree pristine."""
    shutil.copytree(built / "gfx1151" / "root", dest, symlinks=True)
    return dest


def run_launcher(launcher: Path, *args: str, env: dict[str, str] | None = None) -> dict:  # type: ignore[type-arg]
    result = subprocess.run([str(launcher), *args], env=env or {}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    report: dict = json.loads(result.stdout)  # type: ignore[type-arg]
    return report


def test_moved_bundle_runs_with_an_empty_environment(built: Path, tmp_path: Path) -> None:
    moved = copy_of(built, tmp_path / "a place with spaces" / "vllm bundle")
    args = ["--model", "/models/Qwen 3", "--port", "8001", "--served-model-name", "a b", "--max-model-len", "4096"]
    report = run_launcher(moved / "bin" / "vllm-server", *args)
    assert report["executable"] == str(moved / "bin" / f"python{PYTHON_MINOR}")
    assert report["torch"].startswith(str(moved)), "the bundle's torch, not any other"
    assert report["hip_check"] == 17, "torch's native extension reached libamdhip64 through the launcher"
    assert report["argv"] == ["serve", *args, "--attention-backend", "TRITON_ATTN"], "vllm serve, not api_server"
    assert report["env"]["PYTHONNOUSERSITE"] == "1"
    assert report["env"]["FLASH_ATTENTION_TRITON_AMD_ENABLE"] == "TRUE"
    assert report["env"]["CC"] == str(moved / WRAPPER), "the bundle's C compiler wrapper (zig cc)"
    site = moved / "lib" / f"python{PYTHON_MINOR}" / "site-packages"
    assert report["env"]["LD_LIBRARY_PATH"].split(":") == [
        str(site / d)
        for d in ("_rocm_sdk_core/lib", "_rocm_sdk_core/lib/llvm/lib", "_rocm_sdk_libraries/lib", "torch/lib")
    ], "the SDK's, its clang's (libomp) and torch's libraries"


def test_callers_pythonpath_stays_first(built: Path, tmp_path: Path) -> None:
    shim = tmp_path / "shim"
    shim.mkdir()
    root = copy_of(built, tmp_path / "root")
    report = run_launcher(root / "bin" / "vllm-server", env={"PYTHONPATH": str(shim)})
    site_index = next(i for i, p in enumerate(report["sys_path"]) if p.endswith("site-packages"))
    assert report["sys_path"].index(str(shim)) < site_index
    assert report["env"]["PYTHONPATH"] == str(shim)


def test_bundle_tree_is_relocatable_and_pruned(built: Path, tmp_path: Path) -> None:
    root = built / "gfx1151" / "root"
    site = root / "lib" / f"python{PYTHON_MINOR}" / "site-packages"
    assert not (site / "pip").exists(), "pruned"
    assert (site / "ninja").is_dir() and (root / "bin" / "ninja").is_file(), "vLLM's run-time need, kept"
    assert not list(root.rglob("__pycache__"))
    assert (site / "torch" / ".kpack" / "torch_gfx1151.kpack").is_file(), "hidden device code kept"
    assert (site / "_rocm_sdk_libraries" / ".kpack" / "blas_lib_gfx1151.kpack").is_file()
    assert (site / "_rocm_sdk_core" / "lib" / "llvm" / "bin" / "clang-20").is_file(), "versioned clang kept"
    assert os.access(site / "_rocm_sdk_core" / "lib" / "llvm" / "bin" / "clang-20", os.X_OK), "modes preserved"
    script = (root / "bin" / "rocm-sdk").read_text()
    assert script.startswith("#!/bin/sh\n'''exec'"), "console scripts start the bundled python relatively"
    build_path = str(built.resolve()).encode()
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert build_path not in path.read_bytes(), path
    # sysconfig answers with wherever the tree is, not python-build-standalone's /install
    root = copy_of(built, tmp_path / "moved")
    out = subprocess.run(
        [
            str(root / "bin" / f"python{PYTHON_MINOR}"),
            "-c",
            "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={},
    )
    assert out.stdout.strip() == str((root / "lib").resolve())
    moved_rocm_sdk = subprocess.run(
        [str(root / "bin" / "rocm-sdk"), "targets"], capture_output=True, text=True, env={}, check=True
    )
    assert "gfx1151" in moved_rocm_sdk.stdout.split(";"), "a console script runs from the moved bundle"


def test_second_run_downloads_and_rebuilds_nothing(
    built: Path, locked: Path, upstream: UpstreamServer, tmp_path: Path, builder_registry: RegistryServer
) -> None:
    before = tree_digest(built / "gfx1151" / "root")
    result = bundle_cli(locked, upstream, built, built.parent / "cache", builder=builder_registry)
    assert result.returncode == 0, result.stderr
    assert [line.split()[1:3] for line in result.stdout.splitlines() if line.startswith("stage")] == [
        [stage, "cached"] for stage in stage_names() if stage != "image"
    ], "the builder image's root file system too"
    assert "0 downloaded" in result.stdout
    assert [r for r in upstream.log if r.method == "GET"] == [], "no connection for a cached build"
    assert tree_digest(built / "gfx1151" / "root") == before


def test_changing_only_the_launcher_template_redoes_only_the_launcher_and_later(
    locked: Path, upstream: UpstreamServer, tmp_path: Path, built: Path, builder_registry: RegistryServer
) -> None:
    build = tmp_path / "build"
    shutil.copytree(built, build, symlinks=True)
    script = textwrap.dedent("""
        import sys
        import vllm_bundle.tree.launcher as launcher, vllm_bundle.pipeline.build as bundle
        original = launcher.template_text()
        changed = lambda: original.replace("set -eu", "set -eu\\n# a new line in the template")
        launcher.template_text = bundle.template_text = changed
        from vllm_bundle.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            *bundle_args(locked, upstream, build, built.parent / "cache", builder_registry),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    states = {line.split()[1]: line.split()[2] for line in result.stdout.splitlines() if line.startswith("stage")}
    assert states == {
        "python": "cached",
        "site": "cached",
        "vllm-src": "cached",
        "builder": "cached",
        "vllm-wheel": "cached",
        "app": "cached",
        "root": "built",
        "qualify": "built",
        "release": "built",
    }
    assert "# a new line in the template" in (build / "gfx1151" / "root" / "bin" / "vllm-server").read_text()


def test_force_redoes_one_stage_and_what_follows_it(
    locked: Path, upstream: UpstreamServer, built: Path, tmp_path: Path, builder_registry: RegistryServer
) -> None:
    build = tmp_path / "build"
    shutil.copytree(built, build, symlinks=True)
    result = bundle_cli(locked, upstream, build, built.parent / "cache", "--force", "site", builder=builder_registry)
    assert result.returncode == 0, result.stderr
    states = {line.split()[1]: line.split()[2] for line in result.stdout.splitlines() if line.startswith("stage")}
    assert states["python"] == "cached" and states["site"] == "built"
    # the site stage's key is unchanged by a forced rebuild, so what depends on it stays cached
    assert tree_digest(build / "gfx1151" / "root") == tree_digest(built / "gfx1151" / "root")
    assert_one_line_error(
        bundle_cli(locked, upstream, build, built.parent / "cache", "--force", "nope", builder=builder_registry),
        "unknown stage 'nope'",
        "python, site",
    )


def _states(out: str) -> dict[str, str]:
    return {line.split()[1]: line.split()[2] for line in out.splitlines() if line.startswith("stage")}


def test_a_new_stage_is_its_function_and_one_row(
    locked: Path,
    upstream: UpstreamServer,
    built: Path,
    tmp_path: Path,
    builder_registry: RegistryServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A stage added as docs/building.md says ("Adding a stage"), and nothing else touched: its function
    (below) and its row in STAGES (the monkeypatch). It runs in order after the release, reads the results
    before it, gets its own folder (build/<target>/<name>), --force takes its name, the next run finds it
    cached by its key, and the summary lists it."""
    from vllm_bundle.cli import main
    from vllm_bundle.pipeline import build as pipeline
    from vllm_bundle.tree.stage import run_stage

    def notes(b: pipeline.Build, *, out: Path, force: bool) -> StageResult:
        release = b.results["release"]
        text = f"{release.details['tag']} {release.key}\n"
        return run_stage(
            out,
            "notes",
            1,
            {"release": release.key},
            lambda tmp: {"bytes": (tmp / "NOTES").write_text(text)},
            force=force,
        )

    monkeypatch.setattr(pipeline, "STAGES", (*pipeline.STAGES, pipeline.Stage("notes", notes)))
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    build = tmp_path / "build"
    shutil.copytree(built, build, symlinks=True)
    argv = bundle_args(locked, upstream, build, built.parent / "cache", builder_registry)

    runs = []
    for extra in ([], [], ["--force", "notes"]):
        assert main([*argv, *extra]) == 0
        runs.append(capsys.readouterr().out)
    first, again, forced = (_states(out) for out in runs)
    assert (first["notes"], again["notes"], forced["notes"]) == ("built", "cached", "built")
    before = [name for name in stage_names() if name not in ("image", "notes")]
    # (the release is made again: this build's --bundles-dir is its own, empty)
    assert first == {**dict.fromkeys(before, "cached"), "release": "built", "notes": "built"}
    notes_file = build / "gfx1151" / "notes" / "NOTES"
    assert notes_file.read_text().startswith("vllm0.33.0-rocm") and "  notes " in runs[0].split("summary")[1]
    assert list(first) == [*before, "notes"], "in the order of the table"


# -- wheels that share a file ---------------------------------------------------------------------------


def test_wheels_may_ship_the_same_file_with_the_same_bytes_but_not_other_bytes(tmp_path: Path) -> None:
    """TheRock's SDK wheels share an empty _rocm_sdk_libraries/__init__.py; another file at a path an earlier
    wheel wrote is a real conflict, refused naming it."""
    shared = "_rocm_sdk_libraries/__init__.py"
    first = make_wheel(tmp_path / "w", "rocm-sdk-libraries", "1", "py3-none-any", {shared: b"", "a.py": b"a"})
    second = make_wheel(tmp_path / "w", "rocm-sdk-device-gfx1151", "1", "py3-none-any", {shared: b"", "b.py": b"b"})
    layout = Layout(tmp_path / "root", "3.12")
    install_wheels(layout, [first, second])
    assert (layout.site / shared).read_bytes() == b""
    for info in ("rocm_sdk_libraries-1.dist-info", "rocm_sdk_device_gfx1151-1.dist-info"):
        assert shared in (layout.site / info / "RECORD").read_text(), "both wheels record the file they share"
    other = make_wheel(tmp_path / "x", "rocm-sdk-device-gfx1100", "1", "py3-none-any", {shared: b"# other\n"})
    with pytest.raises(AssembleError, match=r"_rocm_sdk_libraries/__init__.py is shipped by an earlier wheel"):
        install_wheels(layout, [other])
    assert (layout.site / shared).read_bytes() == b"", "the first file is left as it was"


#: A wheel member that leaves the stage: from site-packages (lib/python3.12/site-packages, four levels
#: down) and from the ``data`` scheme (the stage's root). Either lands at ``<tmp_path>/x``.
ESCAPING_MEMBERS = ["../../../../x", "pkg-1.data/data/../x"]


@pytest.mark.parametrize("outside", [None, b"x = 1\n", b"other bytes\n"], ids=["absent", "same-bytes", "other-bytes"])
@pytest.mark.parametrize("member", ESCAPING_MEMBERS, ids=["site-packages", "data"])
def test_a_wheel_file_outside_the_stage_is_refused_whatever_is_there(
    member: str, outside: bytes | None, tmp_path: Path
) -> None:
    """Issue #51 F9: a member that escapes the stage is refused by the path check alone, before the file
    already there (a file wheels share) is compared or read. With the same bytes outside it used to install
    and name the outside file in RECORD; with other bytes its message told that the outside file exists."""
    target = tmp_path / "x"
    if outside is not None:
        target.write_bytes(outside)
    wheel = make_wheel(tmp_path / "w", "pkg", "1", "py3-none-any", {"pkg/__init__.py": b"", member: b"x = 1\n"})
    layout = Layout(tmp_path / "root", "3.12")
    layout.site.mkdir(parents=True)  # the stage, as the python stage left it
    escaping = member.removeprefix("pkg-1.data/data/")
    with pytest.raises(AssembleError) as refused:
        install_wheels(layout, [wheel])
    assert str(refused.value) == (
        f"cannot install pkg-1-py3-none-any.whl: Attempting to write {escaping} outside of the target directory"
        " (re-fetch it, or re-lock)"
    ), "the same one line whether or not a file is there, and nothing said of it"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["root", "w", *(["x"] if outside else [])])
    assert (target.read_bytes() if outside is not None else None) == outside, "the outside file is untouched"
    records = [record.read_text() for record in (tmp_path / "root").rglob("RECORD")]
    assert not any("../" in text for text in records), records


def _rewrite_wheel(wheel: Path, change: Callable[[str, bytes], bytes | None]) -> Path:
    """``wheel`` with each member passed through ``change`` (None: left out), its RECORD kept as it was."""
    changed = wheel.with_name(f"changed-{wheel.name}")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(changed, "w", zipfile.ZIP_DEFLATED) as out:
        for info in source.infolist():
            data = change(info.filename, source.read(info))
            if data is not None:
                out.writestr(info, data)
    return changed.replace(wheel)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda name, data: b"other bytes" if name == "pkg/a.py" else data, "pkg/a.py didn't match RECORD"),
        (lambda name, data: data + b"#" if name == "pkg/big.bin" else data, "pkg/big.bin didn't match RECORD"),
        (lambda name, data: None if name.endswith("/RECORD") else data, "RECORD"),
    ],
    ids=["other-bytes", "a-byte-more-at-the-end", "no-record"],
)
def test_a_wheel_whose_files_do_not_match_its_record_is_refused(
    change: Callable[[str, bytes], bytes | None], problem: str, tmp_path: Path
) -> None:
    """Every file's sha256 and size are checked against the wheel's RECORD as it is installed (one pass:
    a large wheel is read once); a file that does not match stops the install, naming the wheel and file."""
    files = {"pkg/__init__.py": b"", "pkg/a.py": b"a = 1\n", "pkg/big.bin": os.urandom(3 << 20)}
    wheel = _rewrite_wheel(make_wheel(tmp_path / "w", "pkg", "1", "py3-none-any", files), change)
    with pytest.raises(AssembleError, match=re.escape(problem)) as refused:
        install_wheels(Layout(tmp_path / "root", "3.12"), [wheel])
    assert "cannot install pkg-1-py3-none-any.whl" in str(refused.value)


def test_every_file_of_a_wheel_is_checked_against_its_record_scripts_too(tmp_path: Path) -> None:
    """A ``#!python`` script (its shebang rewritten on the way) is checked as the wheel ships it; a file
    RECORD does not name is refused."""
    files = {"pkg/__init__.py": b"", "pkg-1.data/scripts/tool": b"#!python\nprint(1)\n"}
    wheel = make_wheel(tmp_path / "w", "pkg", "1", "py3-none-any", files)
    layout = Layout(tmp_path / "root", "3.12")
    install_wheels(layout, [wheel])
    assert (layout.root / "bin" / "tool").read_bytes() == b"#!/bin/python3.12\nprint(1)\n"
    tampered = _rewrite_wheel(wheel, lambda name, data: b"#!python\nprint(2)\n" if name.endswith("/tool") else data)
    with pytest.raises(AssembleError, match=re.escape("pkg-1.data/scripts/tool didn't match RECORD")):
        install_wheels(Layout(tmp_path / "again", "3.12"), [tampered])
    extra = _rewrite_wheel(wheel, lambda name, data: data)
    with zipfile.ZipFile(extra, "a") as out:
        out.writestr("pkg/unlisted.py", b"")
    with pytest.raises(AssembleError, match=re.escape("pkg/unlisted.py is not mentioned in RECORD")):
        install_wheels(Layout(tmp_path / "third", "3.12"), [extra])


# -- unsafe CPython tarballs -------------------------------------------------------------------------


def _tarball(path: Path, evil: tarfile.TarInfo, data: bytes = b"") -> Path:
    with tarfile.open(path, "w:gz") as archive:
        ok = tarfile.TarInfo(f"python/bin/python{PYTHON_MINOR}")
        ok.size = 4
        archive.addfile(ok, io.BytesIO(b"\x7fELF"))
        archive.addfile(evil, io.BytesIO(data) if data else None)
    return path


def _entry(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, linkname, size
    return info


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (_entry("/tmp/vllm-bundle-evil", size=4), "absolute path"),
        (_entry("python/../../vllm-bundle-evil", size=4), "'..' component"),
        (_entry("python/lib/escape", tarfile.SYMTYPE, "../../../vllm-bundle-evil"), "symlink leaving the tree"),
        (_entry("python/lib/abs", tarfile.SYMTYPE, "/etc/passwd"), "symlink to an absolute path"),
        (_entry("python/lib/up", tarfile.SYMTYPE, "../../sibling"), "symlink leaving the tree"),
        (_entry("python/lib/hard", tarfile.LNKTYPE, "../vllm-bundle-evil"), "hard link leaving"),
        (_entry("python/dev/sda", tarfile.BLKTYPE), "device node"),
        (_entry("python/dev/pipe", tarfile.FIFOTYPE), "FIFO"),
        (_entry("other/file", size=4), "outside the python/ directory"),
    ],
)
def test_unsafe_python_tarball_is_refused(tmp_path: Path, entry: tarfile.TarInfo, reason: str) -> None:
    tarball = _tarball(tmp_path / "cpython-evil.tar.gz", entry, b"evil" if entry.size else b"")
    build = tmp_path / "work" / "build"
    with pytest.raises(BundleError) as caught:
        python_stage(tarball, sha256_file(tarball), PYTHON_MINOR, out=build / "gfx1151" / "python")
    assert reason in str(caught.value) and "refusing to extract cpython-evil.tar.gz" in str(caught.value)
    assert not (tmp_path / "vllm-bundle-evil").exists() and not Path("/tmp/vllm-bundle-evil").exists()
    assert not (build / "gfx1151" / "python").exists(), "nothing extracted, nothing marked complete"
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and build not in p.parents and p != tarball]
    assert outside == [], "nothing written outside build/"


# -- crash safety --------------------------------------------------------------------------------------

KILLER = textwrap.dedent("""
    import os, signal, sys
    import vllm_bundle.tree.stage as stage
    victim = sys.argv[1]
    original = stage.run_stage
    def run_stage(out, name, version, inputs, build, *, force=False):
        if name != victim:
            return original(out, name, version, inputs, build, force=force)
        def dying(tmp):
            details = build(tmp)  # the stage's work is done in its temporary directory...
            os.kill(os.getpid(), signal.SIGKILL)  # ...and the process dies before the rename
        return original(out, name, version, inputs, dying, force=True)
    for module in ("tree.python_stage", "tree.assemble", "tree.vllm_source", "tree.vllm_build", "qualify.tier0",
                   "release.assets"):
        __import__(f"vllm_bundle.{module}")
        setattr(sys.modules[f"vllm_bundle.{module}"], "run_stage", run_stage)
    from vllm_bundle.cli import main
    sys.exit(main(sys.argv[2:]))
""")


def _stamp(build: Path, stage: str) -> Path | None:
    """The stage's completion stamp, if it has one (release: ``bundles/.<tag>.stage.json``)."""
    if stage == "release":
        return next((build.parent / "bundles").glob(".*.stage.json"), None)
    stamp = build / "gfx1151" / f".{stage}.stage.json"
    return stamp if stamp.exists() else None


def _assert_nothing_looks_complete(build: Path, stage: str) -> None:
    assert _stamp(build, stage) is None, f"the killed stage {stage} has no stamp"
    if stage == "release":  # its output is bundles/<tag>
        bundles = build.parent / "bundles"
        assert [p.name for p in bundles.iterdir() if not p.name.startswith(".")] == [], "and no output"
    else:
        assert not (build / "gfx1151" / stage).exists(), f"and {stage} has no output in its final place"


def test_sigkill_in_each_stage_leaves_nothing_that_looks_complete(
    locked: Path, upstream: UpstreamServer, built: Path, tmp_path: Path, builder_registry: RegistryServer
) -> None:
    """A build killed in each stage in turn, just before the stage's rename: each run first redoes the
    stage the run before it died in, and leaves every stage before that as it was (its stamp untouched);
    the killed stage leaves no stamp and no output. A last run redoes only the last stage, and the tree
    and the assets are those of an uninterrupted build."""
    build = tmp_path / "build"
    args = bundle_args(locked, upstream, build, built.parent / "cache", builder_registry)
    stamps: dict[str, tuple[int, int]] = {}
    for index, stage in enumerate(STAGES):
        killed = subprocess.run(
            [sys.executable, "-c", KILLER, stage, *args], capture_output=True, text=True, timeout=300
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        _assert_nothing_looks_complete(build, stage)
        for earlier in STAGES[:index]:
            stamp = _stamp(build, earlier)
            assert stamp is not None, f"{earlier} finished before {stage} was killed"
            key = (stamp.stat().st_ino, stamp.stat().st_mtime_ns)
            if earlier != STAGES[index - 1]:
                assert stamps[earlier] == key, f"{earlier} was not redone when {stage} was killed"
            stamps[earlier] = key
    again = bundle_cli(locked, upstream, build, built.parent / "cache", builder=builder_registry)
    assert again.returncode == 0, again.stderr
    rebuilt = [line.split()[1] for line in again.stdout.splitlines() if line.startswith("stage") and "built" in line]
    assert rebuilt == [STAGES[-1]], "only the stage killed last"
    assert tree_digest(build / "gfx1151" / "root") == tree_digest(built / "gfx1151" / "root")
    assert tree_digest(build.parent / "bundles") == tree_digest(built.parent / "bundles"), "same assets"


def test_therocks_preloads_are_rtld_local_in_the_bundle_as_in_vllms_image(built: Path) -> None:
    """The site stage applies patches/rocm-sdk/rtld-local.patch (vLLM 0.33.0 docker/Dockerfile.rocm_base:133-135):
    the bundle's rocm_sdk defaults to RTLD_LOCAL, the stage records it applied, and the RECORD agrees (tier 0
    passed on this bundle; torch's preloads still reach libamdhip64: test_moved_bundle_runs...)."""
    root = built / "gfx1151" / "root"
    probe = (
        "import inspect, rocm_sdk; "
        "print(inspect.signature(rocm_sdk.initialize_process).parameters['rtld_global'].default, "
        "inspect.signature(rocm_sdk.preload_libraries).parameters['rtld_global'].default)"
    )
    result = subprocess.run(
        [str(root / "bin" / f"python{PYTHON_MINOR}"), "-I", "-B", "-c", probe], capture_output=True, text=True
    )
    assert result.stdout.split() == ["False", "False"], result.stderr
    stage = json.loads((built / "gfx1151" / ".site.stage.json").read_text())
    assert stage["details"]["rocm_fixes"] == [
        {"patch_id": "rtld-local", "status": "applied", "variant": "rtld-local.patch"}
    ]
