"""``bundle``: the whole pipeline for one target, stage by stage (DESIGN.md's flow).

    lock (checked) -> fetch -> python -> site -> vllm-src -> builder -> vllm-wheel -> app -> root
    -> qualify -> release -> image (with --image)

``builder`` unpacks the pinned builder image vLLM is compiled in (none with --no-builder: this machine).

Each stage is cached under build/<target>/ by the hash of its declared inputs; an unchanged stage
is skipped and a changed input redoes only the stages that depend on it. ``--force STAGE`` redoes one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol

from packaging.utils import canonicalize_name, parse_wheel_filename

from vllm_bundle.errors import UsageError
from vllm_bundle.inputs.lockfile import Lock, Locked, build_only, wheel_artifacts
from vllm_bundle.inputs.triton_kernels import ROLE as TRITON_KERNELS
from vllm_bundle.manifests import release_tag
from vllm_bundle.oci.image import ImageRecipe, image_spec, image_stage
from vllm_bundle.oci.layout import BaseImage
from vllm_bundle.paths import default_rocm_fixes
from vllm_bundle.qualify.tier0 import REPORT, failure_message, load_rules, qualify_stage, read_report
from vllm_bundle.recipes import Channel, Recipes, Target
from vllm_bundle.release.assets import ReleaseOptions, release_stage, source_date
from vllm_bundle.tree.assemble import app_stage, root_stage, site_stage
from vllm_bundle.tree.builder import DEFAULT_COMPILERS, Builder, ImageFiles, rootfs_stage
from vllm_bundle.tree.launcher import runtime_files, template_text
from vllm_bundle.tree.layout import Layout
from vllm_bundle.tree.prune import load_prune_rules
from vllm_bundle.tree.python_stage import python_stage
from vllm_bundle.tree.scripts import SCRIPT_DIR
from vllm_bundle.tree.stage import StageResult, stage_key
from vllm_bundle.tree.toolchain import wrapper_template, zig_target
from vllm_bundle.tree.vllm_build import RocmInputs, WheelBuild, prebuilt_wheel_stage, wheel_stage
from vllm_bundle.tree.vllm_source import prepare_source
from vllm_bundle.util.fetch import Artifact, Fetcher
from vllm_bundle.util.fsutil import link_or_copy, sha256_file
from vllm_bundle.util.progress import human_size


@dataclass
class BundleRun:
    """What a ``bundle`` run did: each stage's result in order, and how long the fetch took. What the
    command line reports (the tier 0 report, the release, the image) is read from the results."""

    target: str
    channel: str
    build_dir: Path  # build/<target>
    results: list[StageResult] = field(default_factory=list)
    fetch_seconds: float = 0.0
    downloaded: int = 0

    def result(self, name: str) -> StageResult | None:
        """The result of the stage ``name``, or None where it did not run in this build."""
        return next((result for result in self.results if result.name == name), None)

    @property
    def root(self) -> Path:
        return self.build_dir / "root"

    @property
    def report(self) -> Path | None:
        qualify = self.result("qualify")
        return None if qualify is None else qualify.path / REPORT


@dataclass(frozen=True)
class ImageOptions:
    """``--image``: the image recipe, its base (fetched) and the checkout's commit for the labels."""

    recipe: ImageRecipe
    base: BaseImage
    revision: str


@dataclass(frozen=True)
class BuilderOptions:
    """The builder image vLLM is compiled in, as fetched (``image``), and where its root file system is
    unpacked (``rootfs``: in the download cache, by the image's digest)."""

    image: ImageFiles
    rootfs: Path


@dataclass(frozen=True)
class BuildOptions:
    """What the command line asks of a build beyond its inputs. ``release=None`` stops at the bundle tree
    (no archive); ``image`` (which needs ``release``) adds the OCI image stage; ``python_only`` builds vLLM
    without its native code (asked for explicitly, recorded in the launcher and release.json);
    ``warn_only`` lets a bundle that fails tier 0 go on to its release. vLLM is compiled in ``builder``,
    with its host ``compilers``; with ``no_builder`` (asked for explicitly, recorded in release.json) on
    this machine instead."""

    force: frozenset[str] = frozenset()
    release: ReleaseOptions | None = None
    bundles_dir: Path = Path("bundles")
    warn_only: bool = False
    image: ImageOptions | None = None
    python_only: bool = False
    builder: BuilderOptions | None = None
    no_builder: bool = False
    compilers: tuple[str, str] = DEFAULT_COMPILERS


@dataclass
class Build:
    """One bundle build, made once from the command line and the checked lock: what every stage reads,
    and the results of the stages before it (by name)."""

    recipes: Recipes
    target: Target
    channel: Channel
    lock: Lock
    base: Path  # build/<target>
    patches_dir: Path
    fetched: dict[str, Path]  # every locked file, by sha256
    wheels: Sequence[Artifact]  # the bundle's wheels
    build_group: Sequence[Artifact]  # the wheels only the vLLM build needs
    options: BuildOptions
    results: dict[str, StageResult] = field(default_factory=dict)

    @property
    def minor(self) -> str:
        return self.recipes.python.minor

    def forced(self, name: str) -> bool:
        return name in self.options.force

    def wheel_name(self) -> str:
        return str(self.results["vllm-wheel"].details["wheel"])

    def vllm_version(self) -> str:
        """The version of the vLLM wheel built (or re-packaged), as the release is tagged with it."""
        return str(parse_wheel_filename(self.wheel_name())[1])


class StageRun(Protocol):
    """What a stage does: its result in ``out``, redone whatever its stamp says when ``force``."""

    def __call__(self, build: Build, /, *, out: Path, force: bool) -> StageResult: ...


class Stage(NamedTuple):
    """A stage of ``bundle``: its name (``--force NAME``; its output is build/<target>/<name>), what it
    does, whether it runs in this build, what must hold of its result (checked once the stage is
    reported) for the build to go on, and where its output goes when not in the build directory."""

    name: str
    run: StageRun
    runs: Callable[[Build], bool] = lambda build: True
    holds: Callable[[Build, StageResult], None] = lambda build, result: None
    out: Callable[[Build], Path] | None = None

    def output(self, build: Build) -> Path:
        return self.out(build) if self.out is not None else build.base / self.name


def tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def named_wheels(artifacts: Sequence[Artifact], fetched: dict[str, Path], where: Path) -> dict[Path, str]:
    """Cache blobs under their wheel file names (installers parse them), as hard links made afresh each
    run (a name may be re-published with other bytes); returns each path with its pinned sha256."""
    where.mkdir(parents=True, exist_ok=True)
    paths = {}
    for artifact in artifacts:
        named = where / artifact.filename
        named.unlink(missing_ok=True)
        link_or_copy(str(fetched[artifact.sha256]), str(named))
        paths[named] = artifact.sha256
    return paths


# -- the stages, in the order of STAGES below --------------------------------------------------------------
# Each is called as ``run(build, out=..., force=...)``: the loop gives every stage its own output
# directory (build/<target>/<name>, unless its row says where) and whether ``--force`` named it.


def _python(b: Build, *, out: Path, force: bool) -> StageResult:
    python = b.lock.artifact("python")
    return python_stage(b.fetched[python.sha256], python.sha256, b.minor, python.filename, out=out, force=force)


def _site(b: Build, *, out: Path, force: bool) -> StageResult:
    named = named_wheels([w for w in b.wheels if w.name != "vllm"], b.fetched, b.base / ".wheels")
    rocm = b.lock.artifact("rocm-sdist")
    sdists = {b.fetched[rocm.sha256]: (rocm.sha256, rocm.filename)}
    family = b.channel.sdk_target_family(b.target)
    python, date = b.results["python"], b.lock.source_date_epoch
    return site_stage(python, named, b.minor, sdists, date, family, out=out, force=force, fixes=default_rocm_fixes())


def _builds_vllm(b: Build) -> bool:
    """The lock pins vLLM's source release (else a prebuilt wheel is re-packaged: repackage mode)."""
    return "vllm-sdist" in b.lock.roles


def _vllm_source(b: Build, *, out: Path, force: bool) -> StageResult:
    sdist = b.lock.artifact("vllm-sdist")
    version, isas = b.lock.versions["vllm"], b.recipes.all_isas
    return prepare_source(b.fetched[sdist.sha256], sdist.sha256, version, b.patches_dir, isas, out=out, force=force)


def _builder(b: Build, *, out: Path, force: bool) -> StageResult:
    assert b.options.builder is not None
    return rootfs_stage(b.options.builder.image, out=out, force=force)


def _builder_rootfs(b: Build) -> Path:
    """The builder's root file system is unpacked in the download cache, by the image's digest (every
    build of that image shares it), not in the build directory."""
    assert b.options.builder is not None
    return b.options.builder.rootfs


def _where_vllm_builds(b: Build) -> Builder:
    """The builder stage's image, or this machine when --no-builder asked for it; neither is refused."""
    if b.options.builder is not None:
        return Builder.image(b.results["builder"], b.options.builder.image, b.options.compilers)
    if not b.options.no_builder:
        raise UsageError("no builder image to compile vLLM in", "lock it (`vllm-bundle lock`), or pass --no-builder")
    return Builder(compilers=b.options.compilers)


def _vllm_wheel(b: Build, *, out: Path, force: bool) -> StageResult:
    """Build vLLM from the patched source with the bundle's own interpreter, in the builder, or take the
    prebuilt wheel."""
    if not _builds_vllm(b):
        (artifact,) = [w for w in b.wheels if w.name == "vllm"]
        (named,) = named_wheels([artifact], b.fetched, b.base / ".wheels")
        return prebuilt_wheel_stage(named, artifact.sha256, out=out, force=force)
    site = b.results["site"]
    layout = Layout(site.path, b.minor)
    rocm = None
    if not b.options.python_only:
        kernels = None
        if TRITON_KERNELS in b.lock.roles:
            archive = b.lock.artifact(TRITON_KERNELS)
            kernels = (b.fetched[archive.sha256], archive.sha256, archive.filename)
        rocm = RocmInputs(
            triton_kernels=kernels,
            triton_kernels_package=b.recipes.vllm.triton_kernels.package,
            cmake_build_type=b.recipes.vllm.cmake_build_type,
            extensions=b.recipes.vllm.extension_rule(b.lock.versions["vllm"]),
        )
    build_group = named_wheels(b.build_group, b.fetched, b.base / ".wheels")
    environment = WheelBuild(
        layout.python, b.lock.source_date_epoch, rocm, build_group, layout.site, _where_vllm_builds(b)
    )
    source, version, log = b.results["vllm-src"], b.lock.versions["vllm"], b.base / "logs" / "vllm-wheel.log"
    return wheel_stage(b.target, source, version, environment, log, site.key, out=out, force=force)


def _app(b: Build, *, out: Path, force: bool) -> StageResult:
    rules = load_prune_rules(b.recipes.root)
    return app_stage(b.results["site"], b.results["vllm-wheel"], b.minor, rules, b.base, out=out, force=force)


def _root(b: Build, *, out: Path, force: bool) -> StageResult:
    template = stage_key(
        "launcher-template",
        3,
        {"text": template_text(), "runtime": runtime_files(), "cc": wrapper_template(), "script-dir": SCRIPT_DIR},
    )
    vllm = b.lock.versions["vllm"]
    return root_stage(
        b.results["app"],
        b.minor,
        b.recipes.vllm.attention_rule(vllm),
        b.recipes.vllm.server_rule(vllm),
        vllm,
        b.target.name,
        template,
        b.base,
        str(b.results["vllm-wheel"].details.get("device", "")),
        b.recipes.launcher_defaults,
        out=out,
        force=force,
        zig_target=zig_target(b.recipes.python),
    )


def _qualify(b: Build, *, out: Path, force: bool) -> StageResult:
    rules = load_rules(b.recipes.root, b.recipes.python.platform, b.recipes.vllm.extensions)
    return qualify_stage(b.results["root"], b.minor, b.target, rules, b.base, out=out, force=force)


def _tier0_passed(b: Build, checked: StageResult) -> None:
    """A bundle that fails tier 0 stops the build (unless ``warn_only``)."""
    report = read_report(checked.path / REPORT)
    if not report.passed and not b.options.warn_only:
        raise failure_message(report, checked.path / REPORT)


def _release_dir(b: Build) -> Path:
    """The release's assets go to ``--bundles-dir``/<tag>, beside every other release, not the build."""
    return b.options.bundles_dir / release_tag(b.vllm_version(), b.lock.versions["rocm"], b.target.name)


def _release(b: Build, *, out: Path, force: bool) -> StageResult:
    assert b.options.release is not None
    vllm = b.results["vllm-wheel"]
    hashes: dict[str, str] = {canonicalize_name(w.name): w.sha256 for w in b.wheels}
    hashes["vllm"] = sha256_file(vllm.path / b.wheel_name())
    report = read_report(b.results["qualify"].path / REPORT)
    return release_stage(
        lock=b.lock,
        target=b.target.name,
        minor=b.minor,
        root=b.results["root"],
        vllm_version=b.vllm_version(),
        wheel_hashes=hashes,
        options=b.options.release,
        tier0={check.name: check.passed for check in report.checks},
        vllm_build=_vllm_build_record(vllm),
        floor={**(report.floor or {}), "claimed": b.recipes.python.platform} if report.floor else None,
        out=out,
        force=force,
    )


def _image(b: Build, *, out: Path, force: bool) -> StageResult:
    image, release = b.options.image, b.options.release
    assert image is not None and release is not None
    spec = image_spec(
        image.recipe,
        tag=str(b.results["release"].details["tag"]),
        target=b.target.name,
        isas=b.target.isas,
        versions={**b.lock.versions, "vllm": b.vllm_version()},
        repo=release.repo,
        source_date=source_date(b.lock, release.source_date),
        base=image.base,
        revision=image.revision,
    )
    layers = image.recipe.layers
    return image_stage(b.results["root"], image.base, spec, layers, release.level, out=out, force=force)


#: The stages of ``bundle``, in order: each reads the build and the results of the stages before it. A
#: new stage is its function and one row here (docs/building.md, "Adding a stage"; tests/test_bundle.py
#: adds one and counts what else it needs: nothing).
STAGES = (
    Stage("python", _python),
    Stage("site", _site),
    Stage("vllm-src", _vllm_source, runs=_builds_vllm),
    Stage("builder", _builder, runs=lambda b: _builds_vllm(b) and b.options.builder is not None, out=_builder_rootfs),
    Stage("vllm-wheel", _vllm_wheel),
    Stage("app", _app),
    Stage("root", _root),
    Stage("qualify", _qualify, holds=_tier0_passed),
    Stage("release", _release, runs=lambda b: b.options.release is not None, out=_release_dir),
    Stage("image", _image, runs=lambda b: b.options.image is not None),
)


def stage_names() -> tuple[str, ...]:
    """The names ``--force`` takes: every row of :data:`STAGES`, read when asked (a row added is one)."""
    return tuple(stage.name for stage in STAGES)


def check_stage_names(names: Iterable[str]) -> None:
    """``--force`` names only stages that exist."""
    unknown = sorted(set(names) - set(stage_names()))
    if unknown:
        raise UsageError(f"unknown stage {unknown[0]!r} for --force", f"stages: {', '.join(stage_names())}")


def build_bundle(
    recipes: Recipes,
    target: Target,
    channel: Channel,
    locked: Locked,
    fetcher: Fetcher,
    build_root: Path,
    patches_dir: Path,
    options: BuildOptions,
    announce: Callable[[StageResult], None] = lambda result: None,
    starting: Callable[[str], None] = lambda name: None,
) -> BundleRun:
    """Every stage of :data:`STAGES` that runs in this build, for the target, from ``locked`` (the lock
    and pylock as :func:`vllm_bundle.inputs.locker.check_lock` read and checked them: once per build)."""
    lock, pylock = locked
    minor, platform = recipes.python.minor, recipes.python.platform
    wheels, build_group = wheel_artifacts(pylock, minor, platform), build_only(pylock, minor, platform)
    # Absolute: the default --build-dir is relative, and what the stages write names it (links, the build's
    # environment, the builder's mounts), read from other directories.
    run = BundleRun(target.name, channel.name, build_root.absolute() / target.name)

    began = time.monotonic()
    missing = fetcher.missing([*lock.artifacts, *wheels, *build_group])
    fetched = fetcher.fetch_all([*lock.artifacts, *wheels, *build_group])
    run.fetch_seconds, run.downloaded = time.monotonic() - began, len(missing)

    build = Build(recipes, target, channel, lock, run.build_dir, patches_dir, fetched, wheels, build_group, options)
    for stage in STAGES:
        if not stage.runs(build):
            continue
        starting(stage.name)
        result = build.results[stage.name] = stage.run(build, out=stage.output(build), force=build.forced(stage.name))
        run.results.append(result)
        announce(result)
        stage.holds(build, result)
    return run


def _vllm_build_record(vllm: StageResult) -> dict[str, object]:
    """How vLLM was built, for release.json: its device, where (the builder) and, for ROCm, the ISAs of
    each extension."""
    record: dict[str, object] = {"device": vllm.details.get("device")}
    if "extensions" in vllm.details:
        record["isas"] = vllm.details.get("isas")
        record["extensions"] = vllm.details["extensions"]
    if "builder" in vllm.details:
        record["builder"] = vllm.details["builder"]
    notes = []
    if vllm.details.get("device") == "python-only":
        notes.append("built Python-only on request (--python-only-vllm): no GPU kernels of its own")
    if (vllm.details.get("builder") or {}).get("host"):
        notes.append("compiled on the build machine on request (--no-builder), not in the pinned builder image")
    if notes:
        record["note"] = "; ".join(notes)
    return record


def summary_lines(run: BundleRun) -> list[str]:
    """What ran, what was cached, how long it took and how big each stage's output is."""
    lines = ["summary", f"  {'fetch':<11} {'':>6}  {run.fetch_seconds:6.1f} s  {run.downloaded} downloaded"]
    for result in run.results:
        state = "cached" if result.cached else "built"
        lines.append(f"  {result.name:<11} {state:>6}  {result.seconds:6.1f} s  {human_size(tree_size(result.path))}")
    total = sum(r.seconds for r in run.results) + run.fetch_seconds
    lines.append(f"  {'total':<11} {'':>6}  {total:6.1f} s  bundle tree: {run.root}")
    release = run.result("release")
    if release is not None:
        lines.append(f"  {'assets':<11} {'':>6}  {'':>8}  {release.path}")
    return lines
