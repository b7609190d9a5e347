"""``bundle``: the whole pipeline for one target, stage by stage (DESIGN.md's flow).

    lock (checked) -> fetch -> python -> site -> vllm-src -> vllm-wheel -> app -> root -> qualify
    -> release -> image (with --image)

Each stage is cached under build/<target>/ by the hash of its declared inputs; an unchanged stage
is skipped and a changed input redoes only the stages that depend on it. ``--force STAGE`` redoes one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename

from vllm_bundle.inputs.locker import check_lock
from vllm_bundle.inputs.lockfile import Lock, build_only, wheel_artifacts
from vllm_bundle.inputs.triton_kernels import ROLE as TRITON_KERNELS
from vllm_bundle.manifests import check_repo, release_tag
from vllm_bundle.oci.image import ImageRecipe, image_spec, image_stage
from vllm_bundle.oci.layout import BaseImage
from vllm_bundle.qualify.tier0 import REPORT, failure_message, load_rules, qualify_stage, read_report
from vllm_bundle.recipes import Recipes
from vllm_bundle.release.assets import ReleaseOptions, release_stage, source_date
from vllm_bundle.tree.assemble import Layout, app_stage, root_stage, site_stage
from vllm_bundle.tree.launcher import runtime_files, template_text
from vllm_bundle.tree.prune import load_prune_rules
from vllm_bundle.tree.python_stage import python_stage
from vllm_bundle.tree.scripts import SCRIPT_DIR
from vllm_bundle.tree.stage import StageResult, check_stage_names, stage_key
from vllm_bundle.tree.toolchain import wrapper_template, zig_target
from vllm_bundle.tree.vllm_build import RocmInputs, WheelBuild, prebuilt_wheel_stage, wheel_stage
from vllm_bundle.tree.vllm_source import prepare_source
from vllm_bundle.util.fetch import Artifact, Fetcher
from vllm_bundle.util.fsutil import link_or_copy, sha256_file
from vllm_bundle.util.progress import human_size


@dataclass
class BundleRun:
    target: str
    channel: str
    build_dir: Path  # build/<target>
    results: list[StageResult] = field(default_factory=list)
    fetch_seconds: float = 0.0
    downloaded: int = 0
    release_dir: Path | None = None
    report: Path | None = None
    image_dir: Path | None = None
    image: Mapping[str, Any] | None = None  # the image stage's record: tag, digest, size, vllm, created
    tag: str = ""

    @property
    def root(self) -> Path:
        return self.build_dir / "root"


@dataclass(frozen=True)
class ImageOptions:
    """``--image``: the image recipe, its base (fetched) and the checkout's commit for the labels."""

    recipe: ImageRecipe
    base: BaseImage
    revision: str


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


def build_bundle(
    recipes: Recipes,
    target_name: str,
    channel_name: str,
    locks_dir: Path,
    fetcher: Fetcher,
    build_root: Path,
    patches_dir: Path,
    force: Sequence[str] = (),
    announce: Callable[[StageResult], None] = lambda result: None,
    starting: Callable[[str], None] = lambda name: None,
    release: ReleaseOptions | None = None,
    bundles_dir: Path = Path("bundles"),
    warn_only: bool = False,
    image: ImageOptions | None = None,
    python_only: bool = False,
) -> BundleRun:
    """Run every stage for the target; ``release=None`` stops at the bundle tree (no archive);
    ``image`` (which needs ``release``) adds the OCI image stage; ``python_only`` builds vLLM without its
    native code (asked for explicitly, recorded in the launcher and release.json)."""
    check_stage_names(force)
    target, channel = recipes.target(target_name), recipes.channel(channel_name)
    lock, pylock = check_lock(recipes, target, channel, locks_dir)
    if release is not None:
        check_repo(release.repo)  # before any stage runs, not after an hour of building
    minor = recipes.python.minor
    wheels = wheel_artifacts(pylock, minor, recipes.python.platform)
    for_build = build_only(pylock, minor, recipes.python.platform)
    run = BundleRun(target.name, channel.name, build_root / target.name)
    base = run.build_dir

    began = time.monotonic()
    missing = fetcher.missing([*lock.artifacts, *wheels, *for_build])
    fetched = fetcher.fetch_all([*lock.artifacts, *wheels, *for_build])
    run.fetch_seconds, run.downloaded = time.monotonic() - began, len(missing)

    def step(result: StageResult) -> StageResult:
        run.results.append(result)
        announce(result)
        return result

    def begin(name: str) -> None:
        starting(name)

    python = lock.artifact("python")
    begin("python")
    py = step(
        python_stage(fetched[python.sha256], python.sha256, minor, base / "python", "python" in force, python.filename)
    )
    others = [w for w in wheels if w.name != "vllm"]
    begin("site")
    named = named_wheels(others, fetched, base / ".wheels")
    rocm = lock.artifact("rocm-sdist")
    sdists = {fetched[rocm.sha256]: (rocm.sha256, rocm.filename)}
    family = channel.sdk_target_family(target)
    site = step(site_stage(py, named, minor, base / "site", "site" in force, sdists, lock.source_date_epoch, family))
    begin("vllm-wheel")
    build = _BuildPlan(lock, wheels, for_build, fetched, python_only)
    vllm = step(_vllm_wheel(recipes, target_name, build, site, patches_dir, base, force, step))
    device = str(vllm.details.get("device", ""))
    rules = load_prune_rules(recipes.root)
    begin("app")
    app = step(app_stage(site, vllm, minor, rules, base, base / "app", "app" in force))
    template = stage_key(
        "launcher-template",
        3,
        {"text": template_text(), "runtime": runtime_files(), "cc": wrapper_template(), "script-dir": SCRIPT_DIR},
    )
    begin("root")
    root = step(
        root_stage(
            app,
            minor,
            recipes.vllm.attention_rule(lock.versions["vllm"]),
            recipes.vllm.server_rule(lock.versions["vllm"]),
            lock.versions["vllm"],
            target.name,
            template,
            base,
            base / "root",
            "root" in force,
            vllm_build=device,
            defaults=recipes.launcher_defaults,
            zig_target=zig_target(recipes.python),
        )
    )
    begin("qualify")
    checked = step(
        qualify_stage(
            root,
            minor,
            target,
            load_rules(recipes.root, recipes.python.platform, recipes.vllm.extensions),
            base,
            base / "qualify",
            "qualify" in force,
        )
    )
    run.report = checked.path / REPORT
    report = read_report(run.report)
    if not report.passed and not warn_only:
        raise failure_message(report, run.report)
    if release is not None:
        begin("release")
        wheel_name = str(vllm.details["wheel"])
        hashes: dict[str, str] = {canonicalize_name(w.name): w.sha256 for w in wheels}
        hashes["vllm"] = sha256_file(vllm.path / wheel_name)
        result = step(
            release_stage(
                lock=lock,
                locks_dir=locks_dir,
                target=target.name,
                minor=minor,
                root=root,
                vllm_version=str(parse_wheel_filename(wheel_name)[1]),
                wheel_hashes=hashes,
                bundles_dir=bundles_dir,
                options=release,
                tier0={check.name: check.passed for check in report.checks},
                vllm_build=_vllm_build_record(vllm),
                force="release" in force,
            )
        )
        run.release_dir = result.path
        run.tag = str(result.details["tag"])
        if image is not None:
            begin("image")
            vllm_version = str(parse_wheel_filename(wheel_name)[1])
            spec = image_spec(
                image.recipe,
                tag=release_tag(vllm_version, lock.versions["rocm"], target.name),
                target=target.name,
                isas=target.isas,
                versions={**lock.versions, "vllm": vllm_version},
                repo=release.repo,
                source_date=source_date(lock, release.source_date),
                base=image.base,
                revision=image.revision,
            )
            layers = image.recipe.layers
            built = step(image_stage(root, image.base, spec, layers, release.level, base / "image", "image" in force))
            run.image_dir, run.image = built.path, built.details
    return run


@dataclass(frozen=True)
class _BuildPlan:
    """What the vllm-wheel stage takes from the lock: the locked wheels (the bundle's and the build
    group's), the fetched files by sha256, and whether a Python-only build was asked for."""

    lock: Lock
    wheels: Sequence[Artifact]
    build_group: Sequence[Artifact]
    fetched: dict[str, Path]
    python_only: bool


def _vllm_build_record(vllm: StageResult) -> dict[str, object]:
    """How vLLM was built, for release.json: its device and, for ROCm, the ISAs of each extension."""
    record: dict[str, object] = {"device": vllm.details.get("device")}
    if "extensions" in vllm.details:
        record["isas"] = vllm.details.get("isas")
        record["extensions"] = vllm.details["extensions"]
    if vllm.details.get("device") == "python-only":
        record["note"] = "built Python-only on request (--python-only-vllm): no GPU kernels of its own"
    return record


def _vllm_wheel(
    recipes: Recipes,
    target_name: str,
    plan: _BuildPlan,
    site: StageResult,
    patches_dir: Path,
    base: Path,
    force: Sequence[str],
    step: Callable[[StageResult], StageResult],
) -> StageResult:
    """Build vLLM from the patched source with the bundle's own interpreter, or take the prebuilt wheel."""
    lock = plan.lock
    if "vllm-sdist" not in lock.roles:
        (artifact,) = [w for w in plan.wheels if w.name == "vllm"]
        (named,) = named_wheels([artifact], plan.fetched, base / ".wheels")
        return prebuilt_wheel_stage(named, artifact.sha256, base / "vllm-wheel", "vllm-wheel" in force)
    sdist = lock.artifact("vllm-sdist")
    source = step(
        prepare_source(
            plan.fetched[sdist.sha256],
            sdist.sha256,
            lock.versions["vllm"],
            patches_dir,
            base / "vllm-src",
            recipes.all_isas,
            "vllm-src" in force,
        )
    )
    layout = Layout(site.path, recipes.python.minor)
    rocm = None
    if not plan.python_only:
        kernels = None
        if TRITON_KERNELS in lock.roles:
            archive = lock.artifact(TRITON_KERNELS)
            kernels = (plan.fetched[archive.sha256], archive.sha256, archive.filename)
        rocm = RocmInputs(
            triton_kernels=kernels,
            triton_kernels_package=recipes.vllm.triton_kernels.package,
            cmake_build_type=recipes.vllm.cmake_build_type,
            extensions=recipes.vllm.extension_rule(lock.versions["vllm"]),
        )
    return wheel_stage(
        recipes.target(target_name),
        source,
        lock.versions["vllm"],
        WheelBuild(
            layout.python,
            lock.source_date_epoch,
            rocm,
            named_wheels(plan.build_group, plan.fetched, base / ".wheels"),
            layout.site,
        ),
        base / "vllm-wheel",
        base / "logs" / "vllm-wheel.log",
        "vllm-wheel" in force,
        python_key=site.key,
    )


def summary_lines(run: BundleRun) -> list[str]:
    """What ran, what was cached, how long it took and how big each stage's output is."""
    lines = ["summary", f"  {'fetch':<11} {'':>6}  {run.fetch_seconds:6.1f} s  {run.downloaded} downloaded"]
    for result in run.results:
        state = "cached" if result.cached else "built"
        lines.append(f"  {result.name:<11} {state:>6}  {result.seconds:6.1f} s  {human_size(tree_size(result.path))}")
    total = sum(r.seconds for r in run.results) + run.fetch_seconds
    lines.append(f"  {'total':<11} {'':>6}  {total:6.1f} s  bundle tree: {run.root}")
    if run.release_dir is not None:
        lines.append(f"  {'assets':<11} {'':>6}  {'':>8}  {run.release_dir}")
    return lines
