"""The build verbs (``lock``, ``probe``, ``fetch``, ``patch``, ``vllm-wheel``, ``bundle``/``image``,
``verify-repro``, ``merge-manifests``): each takes the parsed command line, runs the stages of
:mod:`vllm_bundle.pipeline.build` (the one place they are wired) and prints what happened."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_bundle.errors import (
    LockError,
    LockMissingError,
    LockOutOfDateError,
    NotReproducibleError,
    RecipeError,
    RegistryError,
    UsageError,
    redact_urls,
)
from vllm_bundle.inputs.facts import load_facts
from vllm_bundle.inputs.locker import Sources, check_lock, make_lock
from vllm_bundle.inputs.lockfile import BUILD_GROUP, Locked, wheel_artifacts
from vllm_bundle.inputs.probe import run_probe
from vllm_bundle.inputs.simple_index import project_files
from vllm_bundle.manifests import ReleaseAssets
from vllm_bundle.oci.builder import BuilderRecipe, image_files, load_builder_recipe
from vllm_bundle.oci.image import (
    LAYOUT,
    ImageRecipe,
    base_lock_path,
    base_pin,
    fetch_base,
    image_reference,
    load_image_recipe,
    read_base_lock,
    read_image_record,
    revision,
)
from vllm_bundle.oci.kserve import check_target, render_kserve
from vllm_bundle.oci.layout import MANIFEST, Descriptor
from vllm_bundle.oci.pinned import Pin, fetch_image, lock_image, read_lock
from vllm_bundle.oci.registry import CYCLONEDX, Reference, RegistryClient, mirrored, push_layout, push_referrer
from vllm_bundle.paths import default_facts
from vllm_bundle.pipeline.build import (
    BuilderOptions,
    BuildOptions,
    ImageOptions,
    build_bundle,
    check_stage_names,
    named_wheels,
    summary_lines,
)
from vllm_bundle.pipeline.console import say, stage_printer
from vllm_bundle.pipeline.options import cache_of, fetcher_of, locks_dir, policy_of, recipes_of
from vllm_bundle.qualify.commands import print_report
from vllm_bundle.qualify.repro import build_twice, compare_asset_dirs, compare_layouts
from vllm_bundle.qualify.tier0 import read_report
from vllm_bundle.recipes import Recipes, Target
from vllm_bundle.release.assets import ReleaseOptions, default_repo, source_date_from_env
from vllm_bundle.tree.stage import StageResult, exclusive
from vllm_bundle.tree.vllm_build import WheelBuild, prebuilt_wheel_stage, wheel_stage
from vllm_bundle.tree.vllm_source import outcomes_of, prepare_source
from vllm_bundle.util.fetch import Artifact, Fetcher
from vllm_bundle.util.policy import PAGE_LIMIT, RetryPolicy
from vllm_bundle.util.progress import human_size, make_reporter
from vllm_bundle.util.transport import make_session


def locked_artifacts(recipes: Recipes, args: argparse.Namespace, target: str, channel: str) -> list[Artifact]:
    """Every artifact the lock pins for (target, channel), refusing a lock older than its recipe."""
    lock, pylock = check_lock(recipes, recipes.target(target), recipes.channel(channel), locks_dir(args))
    python = recipes.python
    return [*lock.artifacts, *wheel_artifacts(pylock, python.minor, python.platform, frozenset({BUILD_GROUP}))]


def _make_lock(recipes: Recipes, args: argparse.Namespace, target_name: str) -> str:
    """Lock one target in ``args.channel``; returns a line naming the pinned versions."""
    target, channel = recipes.target(target_name), recipes.channel(args.channel)
    with fetcher_of(args, None) as fetcher:  # no --mirror here: the lock applies it to release files itself
        sources = Sources(args.therock_index, args.pypi_index, args.mirror)
        lock = make_lock(recipes, target, channel, fetcher, sources, locks_dir(args))
    pins = ", ".join(f"{k} {v}" for k, v in sorted(lock.versions.items()))
    return f"locked {target.name} ({channel.name}): {pins}"


def cmd_lock(args: argparse.Namespace) -> int:
    recipes = recipes_of(args)
    recipes.channel(args.channel)
    targets = [recipes.target(name).name for name in args.targets]
    if args.check:
        return _check_locks(recipes, args, targets)
    if not targets and not args.image and not args.builder:
        raise UsageError("lock needs a target (or --image, --builder)", f"valid targets: {', '.join(recipes.targets)}")
    for target in targets:
        print(_make_lock(recipes, args, target))
    if args.builder:
        print(_lock_image(args, load_builder_recipe(args.recipes).pin))
    if args.image:
        print(_lock_image(args, base_pin(load_image_recipe(args.recipes))))
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    recipes = recipes_of(args)
    target, channel = recipes.target(args.target), recipes.channel(args.channel)
    path = args.facts or default_facts()
    facts = load_facts(path)
    sources = Sources(args.therock_index, args.pypi_index, args.mirror)
    # Every answer read whole, bounded in size and time: a host that sends without end or trickles is
    # given up on in one line (the read timeout alone bounds each read, not the answer).
    policy = RetryPolicy(read_timeout=args.read_timeout, body_limit=PAGE_LIMIT, body_deadline=args.response_deadline)
    with make_session(policy) as session:

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
    locks = locks_dir(args)
    if targets:
        pairs = [(recipes.target(t), recipes.channel(args.channel)) for t in targets]
    else:  # every lock present, in every channel
        pairs = [
            (recipes.target(path.name.removesuffix(".toml")), recipes.channel(path.parent.name))
            for path in sorted(locks.glob("*/*.toml"))
            if not path.name.startswith("pylock.")
        ]
        if not pairs and not args.image and not args.builder:
            raise LockError(f"no locks under {locks}", "run `nox -s lock -- <target>` where upstream is reachable")
    for target, channel in pairs:
        check_lock(recipes, target, channel, locks)
        print(f"ok     {channel.name}/{target.name}: lock matches its recipe")
    builder = load_builder_recipe(args.recipes)
    if args.builder or (locks / builder.pin.lock_file).exists():
        pinned = read_lock(locks, builder.pin)
        print(f"ok     builder image {pinned.reference}: lock matches its recipe ({pinned.manifest.digest})")
    if args.image or base_lock_path(locks).exists():
        lock = read_base_lock(locks, load_image_recipe(args.recipes))
        print(f"ok     image base {lock.reference}: lock matches its recipe ({lock.manifest.digest})")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    recipes = recipes_of(args)
    artifacts = locked_artifacts(recipes, args, args.target, args.channel)
    total = sum(a.size or 0 for a in artifacts)
    with fetcher_of(args, total, args.mirror) as fetcher:
        missing = fetcher.missing(artifacts)
        fetcher.fetch_all(artifacts)
    print(
        f"fetched {args.target} ({args.channel}): {len(artifacts)} artifacts, {human_size(total)} in "
        f"{fetcher.cache.root}; {len(missing)} downloaded ({human_size(fetcher.bytes_transferred)} "
        f"transferred), {len(artifacts) - len(missing)} already cached"
    )
    return 0


def _standalone_lock(args: argparse.Namespace, recipes: Recipes) -> Locked | None:
    """The lock the standalone ``patch`` and ``vllm-wheel`` verbs read, once (none with ``--vllm VERSION``)."""
    if args.vllm:
        return None
    return check_lock(recipes, recipes.target(args.target), recipes.channel(args.channel), locks_dir(args))


def _vllm_sdist(
    args: argparse.Namespace, recipes: Recipes, fetcher: Fetcher, locked: Locked | None
) -> tuple[Path, str, str]:
    """The vLLM source release: the locked one, or ``--vllm VERSION`` from the channel's index."""
    if locked is None:
        if args.offline:
            raise UsageError("--vllm VERSION reads the package index", "drop --offline, or use the locked version")
        index = args.pypi_index or recipes.channel(args.channel).pypi_index
        filename = f"vllm-{args.vllm}.tar.gz"
        entry = next((f for f in project_files(fetcher.session, index, "vllm") if f.filename == filename), None)
        if entry is None or not entry.sha256:
            raise LockError(f"the index {index} has no {filename} with a sha256", "check the version")
        artifact = Artifact("vllm", filename, entry.url, entry.sha256, entry.size)
        return fetcher.fetch_one(artifact), entry.sha256, args.vllm
    lock, _ = locked
    artifact = lock.artifact("vllm-sdist")
    return fetcher.fetch_one(artifact), artifact.sha256, lock.versions["vllm"]


def _source_stage(args: argparse.Namespace, recipes: Recipes, locked: Locked | None) -> tuple[StageResult, str]:
    """The patched source and its vLLM version."""
    with fetcher_of(args, None, args.mirror) as fetcher:
        sdist, sha, version = _vllm_sdist(args, recipes, fetcher, locked)
    out = args.build_dir / args.target / "vllm-src"
    result = prepare_source(sdist, sha, version, args.patches, recipes.all_isas, out=out, force=args.force)
    state = "cached" if result.cached else f"done in {result.seconds:.1f} s"
    if "redone" in result.details:
        state += f"; the cached tree had changed: {result.details['redone']}"
    print(f"stage  vllm-src ({state}): vLLM {version} in {out}")
    for outcome in outcomes_of(result):
        variant = f" ({outcome.variant})" if outcome.variant else ""
        print(f"  {outcome.patch_id:<20} {outcome.status}{variant}")
    return result, version


def _prebuilt_vllm(args: argparse.Namespace, recipes: Recipes, locked: Locked | None) -> tuple[Path, Artifact] | None:
    """In repackage mode (the lock pins a vLLM wheel, not a source release): that wheel, fetched."""
    if locked is None:
        return None
    lock, pylock = locked
    if "vllm-sdist" in lock.roles:
        return None
    wheels = wheel_artifacts(pylock, recipes.python.minor, recipes.python.platform)
    artifact = next((a for a in wheels if a.name == "vllm"), None)
    if artifact is None:
        raise LockError(
            f"the lock for {args.channel}/{args.target} pins neither a vLLM source release nor a wheel", "re-lock"
        )
    with fetcher_of(args, artifact.size, args.mirror) as fetcher:
        path = fetcher.fetch_one(artifact)
    (named,) = named_wheels([artifact], {artifact.sha256: path}, args.build_dir / args.target / ".downloads")
    return named, artifact


def cmd_patch(args: argparse.Namespace) -> int:
    recipes = recipes_of(args)
    recipes.target(args.target)
    with exclusive(args.build_dir / args.target, say):
        locked = _standalone_lock(args, recipes)
        if _prebuilt_vllm(args, recipes, locked) is not None:
            raise RecipeError(
                f"channel {args.channel} uses a prebuilt vLLM wheel (repackage mode): nothing to patch",
                "use a channel without vllm-wheel, or --vllm VERSION",
            )
        _source_stage(args, recipes, locked)
    return 0


def cmd_vllm_wheel(args: argparse.Namespace) -> int:
    recipes = recipes_of(args)
    target = recipes.target(args.target)
    base = args.build_dir.absolute() / args.target  # as `bundle`'s (pipeline/build.py build_bundle)
    with exclusive(base, say):
        return _standalone_wheel(args, recipes, target, base)


#: The zip time of a wheel built outside a bundle (no lock gives a source date): 1980-01-01, the earliest.
STANDALONE_SOURCE_DATE = 315532800


def _standalone_wheel(args: argparse.Namespace, recipes: Recipes, target: Target, base: Path) -> int:
    locked = _standalone_lock(args, recipes)
    prebuilt = _prebuilt_vllm(args, recipes, locked)
    if prebuilt is not None:
        wheel, artifact = prebuilt
        result = prebuilt_wheel_stage(wheel, artifact.sha256, out=base / "vllm-wheel", force=args.force)
    else:
        if not args.python_only:
            raise UsageError(
                "vllm-wheel builds a Python-only wheel with a given interpreter (to try the patch series)",
                "pass --python-only; a ROCm build runs in `bundle`, whose site stage is its build environment",
            )
        source, version = _source_stage(args, recipes, locked)
        python = args.python.absolute()
        if not python.exists():
            raise UsageError(f"no build interpreter at {python}", "pass --python PATH to a Python with torch")
        build = WheelBuild(python, STANDALONE_SOURCE_DATE, rocm=None)
        log = base / "logs" / "vllm-wheel.log"
        result = wheel_stage(target, source, version, build, log, out=base / "vllm-wheel", force=args.force)
    state = "cached" if result.cached else f"done in {result.seconds:.1f} s"
    print(f"stage  vllm-wheel ({state}): {result.path / result.details['wheel']} ({result.details['device']})")
    return 0


def _checked_lock(recipes: Recipes, args: argparse.Namespace) -> Locked:
    """The build's lock and pylock, read and checked once (the build reads no other). As ``uv run``
    does: a missing lock, or one older than its recipe, is made first (one line says so); with
    ``--locked`` (the release workflow) it is refused instead. A lock that fails its own integrity check
    (edited by hand) is never silently replaced."""
    target, channel = recipes.target(args.target), recipes.channel(args.channel)
    try:
        return check_lock(recipes, target, channel, locks_dir(args))
    except (LockMissingError, LockOutOfDateError) as err:
        if args.locked:
            raise
        print(f"lock   {err.message}: locking {args.target} ({args.channel}) first (--locked refuses instead)")
        print(_make_lock(recipes, args, args.target), flush=True)
    return check_lock(recipes, target, channel, locks_dir(args))  # as written, by the bytes the build uses


def cmd_bundle(args: argparse.Namespace) -> int:
    recipes = recipes_of(args)
    recipes.target(args.target)
    recipes.channel(args.channel)
    check_stage_names(args.force_stage)
    wants_image = args.image or bool(args.push)
    if not args.no_archive:
        check_release_dirs(args.build_dir, args.target, args.bundles_dir)
    if wants_image:
        check_target(args.target)  # its KServe names, checked now rather than after the build
    if "image" in args.force_stage and not wants_image:
        raise UsageError("--force image redoes the image stage, which runs only with --image", "add --image")
    if wants_image and args.no_archive:
        raise UsageError("the image needs the release stage (its tag, repo and date)", "drop --no-archive")
    if args.push:
        check_push(args.push)  # a bad destination is refused now, not after the build
    release = None
    if not args.no_archive:  # checked before any lock or stage, not after an hour of building
        release = ReleaseOptions(
            repo=default_repo(args.repo),
            part_size=args.part_size,
            level=args.level,
            source_date=source_date_from_env(),  # $SOURCE_DATE_EPOCH out of range: refused now, not at the SBOM
        )
    locked = _checked_lock(recipes, args)
    builder_recipe = load_builder_recipe(args.recipes)
    in_builder = "vllm-sdist" in locked[0].roles and not args.no_builder  # it compiles vLLM from source
    if in_builder:
        _lock_image_if_needed(args, builder_recipe.pin)
    image_recipe = load_image_recipe(args.recipes) if wants_image else None
    if image_recipe is not None:
        _lock_image_if_needed(args, base_pin(image_recipe))
    with exclusive(args.build_dir / args.target, say):
        builder = _builder_options(args, builder_recipe) if in_builder else None
        image = _image_options(args, image_recipe) if image_recipe is not None else None
        return _build(recipes, args, locked, release, image, builder, builder_recipe.compilers)


def _lock_image_if_needed(args: argparse.Namespace, pin: Pin) -> None:
    """An image's lock (the builder's, the image base's), made first when it is missing or stale, as a
    target's is; refused instead with --locked, and with --offline (locking asks the registry)."""
    try:
        read_lock(locks_dir(args), pin)
    except (LockMissingError, LockOutOfDateError) as err:
        if args.locked:
            raise
        if args.offline:
            raise type(err)(f"--offline: {err.message}", err.hint) from None
        print(f"lock   {err.message}: locking {pin.what} first (--locked refuses instead)")
        print(_lock_image(args, pin), flush=True)


def _lock_image(args: argparse.Namespace, pin: Pin) -> str:
    lock = lock_image(pin, locks_dir(args), cache_of(args), args.registry_mirror, policy_of(args))
    what = pin.what.removeprefix("the ")
    return f"locked {what} {lock.reference}: {lock.manifest.digest} ({len(lock.layers)} layers)"


def _builder_options(args: argparse.Namespace, recipe: BuilderRecipe) -> BuilderOptions:
    """The builder image's blobs, downloaded by digest into the cache where missing, and where its root
    file system is unpacked (the builder stage)."""
    lock, cache = read_lock(locks_dir(args), recipe.pin), cache_of(args)
    image = fetch_image(recipe.pin, lock, cache, args.registry_mirror, policy_of(args), args.offline)
    return BuilderOptions(image_files(image), cache.rootfs(lock.manifest.digest.removeprefix("sha256:")))


def check_push(destination: str) -> Reference:
    """``--push``'s value: an image reference that names its registry host, else a usage error (exit 2)."""
    try:
        return Reference.parse(destination)
    except RegistryError as err:
        raise UsageError(f"--push {err.message}", err.hint) from None


def check_release_dirs(build_dir: Path, target: str, bundles_dir: Path) -> None:
    """The release assets must not land inside the target's build tree (its root is what the archive
    holds, so the next archive would carry this release; every stage folder there is replaced whole),
    nor the build tree inside a release folder (a release replaces its folder whole)."""
    resolved_tree, resolved_bundles = (build_dir / target).resolve(), bundles_dir.resolve()
    if resolved_bundles.is_relative_to(resolved_tree):
        raise UsageError(
            f"--bundles-dir {bundles_dir} is inside {build_dir / target}, the build tree of {target} "
            f"(its root is archived: the next archive would hold this release)",
            "pass a --bundles-dir outside --build-dir's target folders, e.g. ./bundles beside ./build",
        )
    build = build_dir.resolve()
    if build.is_relative_to(resolved_bundles) and len(build.relative_to(resolved_bundles).parts) >= 2:
        raise UsageError(
            f"--build-dir {build_dir} is inside a release folder of --bundles-dir {bundles_dir} "
            f"(a release replaces its folder whole)",
            "keep the build directory out of the bundles directory's folders, e.g. ./build beside ./bundles",
        )


def _image_options(args: argparse.Namespace, recipe: ImageRecipe) -> ImageOptions:
    lock = read_base_lock(locks_dir(args), recipe)
    base = fetch_base(recipe, lock, cache_of(args), args.registry_mirror, policy_of(args), args.offline)
    return ImageOptions(recipe, base, revision())


def _build(
    recipes: Recipes,
    args: argparse.Namespace,
    locked: Locked,
    release: ReleaseOptions | None,
    image: ImageOptions | None,
    builder: BuilderOptions | None,
    compilers: tuple[str, str],
) -> int:
    starting, finished = stage_printer(args)
    with fetcher_of(args, None, args.mirror) as fetcher:
        options = BuildOptions(
            frozenset(args.force_stage),
            release,
            args.bundles_dir,
            args.warn_only,
            image,
            args.python_only_vllm,
            builder,
            args.no_builder,
            compilers,
        )
        target, channel = recipes.target(args.target), recipes.channel(args.channel)
        run = build_bundle(
            recipes,
            target,
            channel,
            locked,
            fetcher,
            args.build_dir,
            args.patches,
            options,
            finished,
            starting,
        )
    if run.report is not None:
        print_report(read_report(run.report), run.report)
    for line in summary_lines(run):
        print(line)
    built_image, released = run.result("image"), run.result("release")
    if built_image is not None and image is not None and release is not None:
        assert released is not None  # the image stage runs after the release stage
        _publish_image(args, recipes, built_image.path, built_image.details, released.path, image.recipe, release.repo)
    return 0


def _publish_image(
    args: argparse.Namespace,
    recipes: Recipes,
    image_dir: Path,
    record: Mapping[str, Any],
    release_dir: Path,
    recipe: ImageRecipe,
    repo: str,
) -> None:
    """Push the image (with --push) with the bundle's SBOM attached, and render the KServe manifests
    for it, pinned by digest. ``record``: the image stage's (tag, digest, size, vLLM version, date)."""
    tag, digest = str(record["tag"]), str(record["digest"])
    print(f"image  {tag} {digest}  (OCI layout: {image_dir / LAYOUT})")
    reference = image_reference(recipe.repository, repo, tag, digest)
    if args.push:
        destination, url = mirrored(check_push(args.push), None)
        destination = Reference(destination.registry, destination.repository, tag)
        client = RegistryClient(url, policy_of(args))
        with make_reporter(None, plain=True if args.plain else None) as reporter:
            result = push_layout(image_dir / LAYOUT, destination, client, reporter)
        sent = f"{result.uploaded} blob{'' if result.uploaded == 1 else 's'} sent, {result.skipped} already there"
        print(f"pushed {result.reference}@{result.digest} ({sent})")
        subject = Descriptor(MANIFEST, digest, int(record["size"]))
        sbom = release_dir / ReleaseAssets(tag).sbom
        attached = push_referrer(client, destination.repository, subject, CYCLONEDX, sbom, str(record["created"]))
        print(f"sbom   {sbom.name} attached to the image as {attached}")
        reference = f"{result.reference}@{result.digest}"
    attention = recipes.vllm.attention_rule(str(record["vllm"]))
    kserve = render_kserve(reference, args.target, attention, image_dir.parent / "kserve")
    print(f"kserve {', '.join(str(path) for path in kserve)}")


def cmd_verify_repro(args: argparse.Namespace) -> int:
    if any(arg == "--push" or arg.startswith("--push=") for arg in args.bundle_args):
        raise UsageError("verify-repro builds twice and pushes nothing", "drop --push")
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
