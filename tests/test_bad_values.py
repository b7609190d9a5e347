"""Bad values from a hostile tester (#21): options out of range, directories that cannot be used, a
bundles directory inside the tree it archives, KServe names Kubernetes refuses, and manifests or locks
whose fields have the wrong type. Each is refused in one line, before anything is written."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import random
import re
import shutil
import subprocess
import tarfile
import tomllib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import tomli_w
import yaml
from packaging.specifiers import SpecifierSet

from tests.conftest import TEST_REPO, assert_one_line_error, copy_recipes, run_cli, small_disk
from tests.test_image import check_against_model
from vllm_bundle.errors import ArchiveError, BundleError, InvalidValueError
from vllm_bundle.inputs.lockfile import Lock, content_digest
from vllm_bundle.manifests import DEFAULT_PART_SIZE, pinned_tag
from vllm_bundle.oci.kserve import render_kserve
from vllm_bundle.oci.layout import iso_time
from vllm_bundle.recipes import AttentionRule
from vllm_bundle.release.archive import PartWriter, write_archive
from vllm_bundle.release.assets import source_date

DIGEST = "sha256:" + "1" * 64
RULE = AttentionRule(SpecifierSet(">=0.13"), "TRITON_ATTN", "--attention-backend", None)


def assert_usage_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """A bad option: exit 2 (argparse's), one line naming the option, nothing else printed."""
    last = assert_one_line_error(result, *fragments)
    assert result.returncode == 2, result
    assert result.stderr.strip() == last, f"one line, no usage dump: {result.stderr!r}"
    return last


# -- 13: --part-size -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-1", "-8388608", "1.5", "big"])
def test_a_part_size_that_is_not_a_positive_number_is_a_usage_error(tmp_path: Path, value: str) -> None:
    result = run_cli("bundle", "gfx1151", "--recipes", tmp_path / "none", "--part-size", value)
    assert_usage_error(result, "--part-size", repr(value))


@pytest.mark.timeout(20)  # before the fix: an endless loop (part size 0 wrote empty parts by the million)
@pytest.mark.parametrize("part_size", [0, -5])
def test_the_archive_writer_refuses_a_part_size_below_one(tmp_path: Path, part_size: int) -> None:
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_text("x" * 1000)
    with pytest.raises(ArchiveError, match=f"part size {part_size} "):
        write_archive(root, tmp_path / "out", "x-x64", part_size=part_size)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


#: Part names carry two digits (``partNN-of-MM``): 99 parts at most.
MAX_PARTS = 99


def _opened_parts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Spies on the archive writer: the number of each part file it opens, in order."""
    opened: list[int] = []
    original = PartWriter._open_next

    def spy(self: PartWriter) -> None:
        original(self)
        opened.append(len(self.parts))

    monkeypatch.setattr(PartWriter, "_open_next", spy)
    return opened


def _random_tree(root: Path, size: int) -> Path:
    """A tree of ``size`` random (incompressible) bytes: its archive is about as large."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "data").write_bytes(random.Random(5).randbytes(size))
    return root


@pytest.mark.timeout(60)  # before the fix: every part was written, then the count was checked
def test_the_archive_writer_stops_before_part_100(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#32 E5: ``--part-size 1`` wrote 883,688 part files (3.5 GB) before finish() said 99 is the most."""
    root = _random_tree(tmp_path / "root", 20_000)
    whole = write_archive(root, tmp_path / "whole", "x-x64")[1]
    opened = _opened_parts(monkeypatch)
    at_most = -(-whole // MAX_PARTS)  # the smallest part size that needs no more than 99 parts
    parts = write_archive(root, tmp_path / "fits", "x-x64", part_size=at_most)[0]
    assert len(parts) <= MAX_PARTS and parts[-1].path.name.endswith(f"-of-{len(parts):02d}.tar.gz")
    too_small = (whole - 1) // MAX_PARTS  # 99 parts of it hold less than the archive
    assert too_small * MAX_PARTS < whole and too_small * MAX_PARTS >= whole // 1032, "not refused up front"
    opened.clear()
    with pytest.raises(ArchiveError) as caught:
        write_archive(root, tmp_path / "out", "x-x64", part_size=too_small)
    assert max(opened) == MAX_PARTS, f"opened parts up to {max(opened)}, not refused before part 100"
    assert str(caught.value) == (
        f"the archive needs more than {MAX_PARTS} parts of {too_small} bytes; part names allow {MAX_PARTS} "
        f"(raise --part-size: {MAX_PARTS} parts held {MAX_PARTS * too_small} bytes and the archive went on)"
    )
    assert list((tmp_path / "out").iterdir()) == [], "the parts written are removed, none left looking complete"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("part_size", [1, 10])
def test_a_part_size_known_to_be_too_small_is_refused_before_any_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, part_size: int
) -> None:
    """At least the tree's bytes divided by deflate's greatest ratio (1032:1) reach the archive: a part
    size that cannot hold that in 99 parts is refused before a part is written."""
    root = tmp_path / "root"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "zeros").write_bytes(bytes(part_size * 110 * 1032))  # compresses about as well as anything
    (root / "lib" / "same").hardlink_to(root / "lib" / "zeros")  # a second name: no second copy
    opened = _opened_parts(monkeypatch)
    with pytest.raises(ArchiveError) as caught:
        write_archive(root, tmp_path / "out", "x-x64", part_size=part_size)
    assert opened == [], "refused before any part was opened"
    message = str(caught.value)
    found = re.fullmatch(
        rf"--part-size {part_size} is too small for {re.escape(str(root))}: its archive is at least (\d+) bytes "
        rf"\(deflate shrinks at most 1032:1\), more than {MAX_PARTS} parts of {part_size} bytes "
        rf"\(pass --part-size of at least (\d+); the default is {DEFAULT_PART_SIZE}\)",
        message,
    )
    assert found, message
    least, hint = int(found[1]), int(found[2])
    assert part_size * 110 <= least < part_size * 110 + 5, "the data counted once, not once per name"
    assert hint == -(-least // MAX_PARTS)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


# -- 14: --bundles-dir inside the tree it archives -------------------------------------------------------


def _bundle(locked: Path, tmp_path: Path, build: Path, bundles: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args: list[str | Path] = ["bundle", "gfx1151", "--recipes", locked, "--cache-dir", tmp_path / "cache"]
    args += ["--offline", "--plain", "--build-dir", build, "--bundles-dir", bundles, "--repo", TEST_REPO, *extra]
    return run_cli(*args)


@pytest.mark.parametrize("inside", ["gfx1151/root/bundles", "gfx1151/root", "gfx1151", "gfx1151/vllm-src/out"])
def test_a_bundles_dir_inside_the_targets_build_tree_is_refused(locked: Path, tmp_path: Path, inside: str) -> None:
    build = tmp_path / "build"
    result = _bundle(locked, tmp_path, build, build / inside)
    assert_one_line_error(result, f"--bundles-dir {build / inside}", f"inside {build / 'gfx1151'}")
    assert "stage" not in result.stdout and not build.exists(), "refused before any stage ran"


def test_a_relative_bundles_dir_inside_the_tree_is_refused_too(locked: Path, tmp_path: Path) -> None:
    result = run_cli(
        *("bundle", "gfx1151", "--recipes", locked, "--cache-dir", tmp_path / "cache", "--offline"),
        *("--build-dir", "b", "--bundles-dir", "b/../b/gfx1151/root/x", "--repo", TEST_REPO),
        cwd=tmp_path,
    )
    assert_one_line_error(result, "--bundles-dir b/../b/gfx1151/root/x", "inside b/gfx1151")
    assert not (tmp_path / "b").exists()


def test_a_build_dir_inside_a_release_folder_is_refused(locked: Path, tmp_path: Path) -> None:
    bundles = tmp_path / "bundles"
    build = bundles / "vllm0.33.0-rocm7.13.0-gfx1151" / "build"
    result = _bundle(locked, tmp_path, build, bundles)
    assert_one_line_error(result, f"--build-dir {build}", f"inside a release folder of --bundles-dir {bundles}")
    assert not bundles.exists()


def test_build_and_bundles_dirs_side_by_side_or_nested_harmlessly_are_accepted(locked: Path, tmp_path: Path) -> None:
    """Only overlaps that lose or leak data are refused: ``out/bundles`` beside ``out/<target>`` is fine
    (the run goes on to its first real problem: here the empty --offline cache)."""
    for build, bundles in ((tmp_path / "out", tmp_path / "out" / "bundles"), (tmp_path / "b" / "x", tmp_path / "b")):
        result = _bundle(locked, tmp_path, build, bundles)
        assert_one_line_error(result, "--offline")
    result = _bundle(locked, tmp_path, tmp_path / "n", tmp_path / "n" / "gfx1151" / "root" / "b", "--no-archive")
    assert_one_line_error(result, "--offline"), "--no-archive writes no release: nothing to leak into"


def test_the_archive_writer_refuses_to_write_into_the_tree_it_archives(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_text("x")
    with pytest.raises(ArchiveError, match="inside the tree it archives"):
        write_archive(root, root / "bundles" / ".tag.tmp", "x-x64")
    assert not (root / "bundles").exists()


# -- 15: KServe names and quoting ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    ["gfx_1151", "g" * 43, "-gfx1151", "gfx1151-", "gfx 1151", "gfx1151 #x", "a: b", "gfx.1151", ""],
)
def test_kserve_refuses_a_target_kubernetes_cannot_name(tmp_path: Path, target: str) -> None:
    with pytest.raises(BundleError, match="Kubernetes") as err:
        render_kserve(f"ghcr.io/x/y:t@{DIGEST}", target, RULE, tmp_path / "kserve")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "kserve").exists()


def test_kserve_takes_the_longest_target_whose_derived_names_fit(tmp_path: Path) -> None:
    """KServe names the predictor's Deployment and Service ``<InferenceService>-predictor``: 63 characters
    at most, as every Kubernetes name here."""
    target = "g" * 42
    runtime_path, service_path = render_kserve(f"ghcr.io/x/y:t@{DIGEST}", target, RULE, tmp_path)
    runtime, service = yaml.safe_load(runtime_path.read_text()), yaml.safe_load(service_path.read_text())
    names = [runtime["metadata"]["name"], service["metadata"]["name"], service["metadata"]["name"] + "-predictor"]
    assert max(len(name) for name in names) == 63
    assert service["spec"]["predictor"]["model"]["runtime"] == runtime["metadata"]["name"]


@pytest.mark.parametrize(
    "image",
    [
        f"registry.example:5000/a #b/c:t@{DIGEST}",
        f"registry.example/a: b/c:t@{DIGEST}",
        f"registry.example/\"a'/c:t@{DIGEST}",
        f"registry.example/a\\n{{b}}/[c]:t@{DIGEST}",
    ],
)
def test_kserve_values_are_quoted_and_keep_the_digest_pin(tmp_path: Path, image: str) -> None:
    runtime_path, service_path = render_kserve(image, "gfx110X", RULE, tmp_path)
    runtime, service = yaml.safe_load(runtime_path.read_text()), yaml.safe_load(service_path.read_text())
    check_against_model(runtime, "V1alpha1ServingRuntime", "runtime")
    check_against_model(service, "V1beta1InferenceService", "service")
    (container,) = runtime["spec"]["containers"]
    assert container["image"] == image, "the image, digest pin included, exactly as given"
    assert container["args"][-1] == "--attention-backend=TRITON_ATTN"
    assert runtime["metadata"]["name"] == "vllm-rocm-gfx110x"
    assert runtime["metadata"]["annotations"]["openshift.io/display-name"] == "vLLM ROCm gfx110x (vllm-bundle)"
    assert service["metadata"]["name"] == "qwen3-0-6b-gfx110x"
    assert service["spec"]["predictor"]["model"]["runtime"] == "vllm-rocm-gfx110x"


def test_image_of_a_target_kubernetes_cannot_name_is_refused_before_any_stage(tmp_path: Path) -> None:
    recipes = copy_recipes(tmp_path / "recipes")
    targets = recipes / "targets.toml"
    text = targets.read_text()
    entry = text[text.index("[targets.gfx1151]") :].split("\n\n", 1)[0]
    targets.write_text(text + "\n" + entry.replace("[targets.gfx1151]", "[targets.gfx_1151]") + "\n")
    build = tmp_path / "build"
    for verb in (("image",), ("bundle", "--image"), ("bundle", "--push", "127.0.0.1:9/x/y")):
        result = run_cli(
            *(*verb, "gfx_1151", "--recipes", recipes, "--locked", "--build-dir", build, "--repo", TEST_REPO),
            *("--cache-dir", tmp_path / "cache", "--bundles-dir", tmp_path / "bundles"),
        )
        assert_one_line_error(result, "target 'gfx_1151'", "Kubernetes", "rename the target")
        assert not build.exists()


@pytest.mark.parametrize("repo", ["own#er/name", "owner/na#me", "owner/name:x", "-owner/name", "owner/..", "a/b/c"])
def test_a_repo_github_cannot_have_is_refused_before_any_stage(locked: Path, tmp_path: Path, repo: str) -> None:
    """``--repo`` ends up in image references and the KServe manifests: GitHub's characters only."""
    result = _bundle(locked, tmp_path, tmp_path / "build", tmp_path / "bundles", f"--repo={repo}")
    assert_one_line_error(result, f"GitHub repository {repo!r} is not <owner>/<name>")
    assert not (tmp_path / "build").exists()


# -- 16: options out of range --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "option", "value"),
    [
        (["install", "http://127.0.0.1:9/r/", "--retries", "0"], "--retries", "0"),
        (["install", "http://127.0.0.1:9/r/", "--retries", "-3"], "--retries", "-3"),
        (["image", "gfx1151", "--push", "127.0.0.1:9/x/y", "--retries", "0"], "--retries", "0"),
        (["fetch", "gfx1151", "--offline", "--read-timeout", "0"], "--read-timeout", "0"),
        (["fetch", "gfx1151", "--offline", "--read-timeout", "-1"], "--read-timeout", "-1"),
        (["fetch", "gfx1151", "--offline", "--read-timeout", "nan"], "--read-timeout", "nan"),
        (["fetch", "gfx1151", "--offline", "--read-timeout", "inf"], "--read-timeout", "inf"),
        (["fetch", "gfx1151", "--offline", "--read-timeout", "1e12"], "--read-timeout", "1e12"),
        (["install", "http://127.0.0.1:9/r/", "--read-timeout", "0"], "--read-timeout", "0"),
        (["fetch", "gfx1151", "--offline", "--jobs", "0"], "--jobs", "0"),
        (["fetch", "gfx1151", "--offline", "-j", "-2"], "--jobs", "-2"),
        (["lock", "gfx1151", "--jobs", "x"], "--jobs", "x"),
        (["qualify-gpu", "b", "--model", "m", "--boot-timeout", "0"], "--boot-timeout", "0"),
        (["qualify-gpu", "b", "--model", "m", "--port", "0"], "--port", "0"),
        (["qualify-gpu", "b", "--model", "m", "--port", "70000"], "--port", "70000"),
        (["qualify-gpu", "b", "--model", "m", "--max-model-len", "0"], "--max-model-len", "0"),
    ],
)
def test_an_option_out_of_range_is_a_one_line_usage_error(
    tmp_path: Path, argv: list[str], option: str, value: str
) -> None:
    result = run_cli(*argv, "--recipes", tmp_path / "none", "--cache-dir", tmp_path / "cache")
    assert_usage_error(result, f"argument {option}", repr(value), "--help")


def test_an_unknown_option_or_a_missing_argument_is_one_line_too(tmp_path: Path) -> None:
    assert_usage_error(run_cli("fetch", "gfx1151", "--no-such-option"), "unrecognized arguments: --no-such-option")
    assert_usage_error(run_cli("merge-manifests", tmp_path / "a.json"), "-o/--output")


def test_a_cache_dir_that_cannot_be_used_is_one_line(locked: Path, tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("")
    fetch = ("fetch", "gfx1151", "--recipes", locked, "--offline", "--cache-dir")
    assert_one_line_error(run_cli(*fetch, file), f"--cache-dir {file} is not a directory")
    assert_one_line_error(run_cli(*fetch, file / "sub"), f"--cache-dir {file / 'sub'}", f"{file} is a file")
    env = {"VLLM_BUNDLE_CACHE_DIR": str(file)}
    assert_one_line_error(run_cli(*fetch[:-1], env=env), f"VLLM_BUNDLE_CACHE_DIR {file} is not a directory")
    with small_disk(tmp_path / "ro", "1m", read_only=True) as ro:
        assert_one_line_error(run_cli(*fetch, ro), f"--cache-dir {ro} is not writable", "read-only file system")
        assert_one_line_error(run_cli(*fetch, ro / "cache"), f"--cache-dir {ro / 'cache'} cannot be made")
        install = run_cli("install", "http://127.0.0.1:9/r/", "--dest", tmp_path / "d", "--cache-dir", ro / "c")
        assert_one_line_error(install, "--cache-dir", "read-only file system")


def test_a_build_dir_that_cannot_be_used_is_one_line(locked: Path, tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("")
    for verb in (
        ("bundle", "--repo", TEST_REPO, "--bundles-dir", str(tmp_path / "bundles")),
        ("patch",),
        ("vllm-wheel",),
    ):
        result = run_cli(
            *(verb[0], "gfx1151", *verb[1:], "--recipes", locked, "--offline", "--cache-dir", tmp_path / "cache"),
            *("--build-dir", file),
        )
        assert_one_line_error(result, f"--build-dir {file} is not a directory")
    with small_disk(tmp_path / "ro", "1m", read_only=True) as ro:
        result = run_cli(
            *("bundle", "gfx1151", "--recipes", locked, "--offline", "--cache-dir", tmp_path / "cache"),
            *("--build-dir", ro / "build", "--repo", TEST_REPO, "--bundles-dir", tmp_path / "bundles"),
        )
        assert_one_line_error(result, f"--build-dir {ro / 'build'} cannot be made", "read-only file system")
        result = run_cli(
            *("bundle", "gfx1151", "--recipes", locked, "--offline", "--cache-dir", tmp_path / "cache"),
            *("--build-dir", tmp_path / "build", "--repo", TEST_REPO, "--bundles-dir", ro / "bundles"),
        )
        assert_one_line_error(result, f"--bundles-dir {ro / 'bundles'} cannot be made", "read-only file system")
    assert not (tmp_path / "build").exists()


# -- 16: manifests with fields of the wrong type -------------------------------------------------------

PIN = "vllm0.33.0-rocm7.13.0"
TAG = f"{PIN}-gfx1151"
PART = f"{TAG}-x64.part01-of-01.tar.gz"
GOOD: dict[str, Any] = {
    "vllm": {"rocm": PIN},
    "checksums": {"github": {TEST_REPO: {TAG: {PART: "sha256:" + "a" * 64}}}},
}


def _edit(path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        for key in path[:-1]:
            doc = doc[key]
        doc[path[-1]] = value

    return edit


BAD_MANIFESTS = [
    (_edit(("vllm",), ["x"]), "vllm is an array, not a JSON object"),
    (_edit(("vllm", "rocm"), 5), "vllm.rocm is a number, not a string"),
    (_edit(("vllm", "rocm_arch_overrides"), ["gfx942"]), "vllm.rocm_arch_overrides is an array"),
    (_edit(("vllm", "rocm_arch_overrides"), {"gfx942": None}), "vllm.rocm_arch_overrides.gfx942 is null"),
    (_edit(("checksums",), "x"), "checksums is a string, not a JSON object"),
    (_edit(("checksums", "github"), []), "checksums.github is an array"),
    (_edit(("checksums", "github", TEST_REPO), [TAG]), f"checksums.github.{TEST_REPO} is an array"),
    (_edit(("checksums", "github", TEST_REPO, TAG), PART), f"checksums.github.{TEST_REPO}.{TAG} is a string"),
    (_edit(("checksums", "github", TEST_REPO, TAG, PART), 5), f"{TAG}.{PART} is a number, not sha256:<64"),
    (_edit(("checksums", "github", TEST_REPO, TAG, PART), {"sha256": "a"}), f"{PART} is a JSON object, not sha256:"),
    (
        _edit(("checksums", "github", TEST_REPO, TAG, PART), "sha256:../../x"),
        f"{PART} is 'sha256:../../x', not sha256:<64",
    ),
    (_edit(("checksums", "github", TEST_REPO, TAG, PART), "md5:" + "a" * 32), f"{PART} is 'md5:aaa"),
    (
        _edit(("checksums", "github"), {"no-slash": {}}),
        "checksums.github names 'no-slash', not a repository's <owner>/<name>",
    ),
]


@pytest.mark.parametrize(("edit", "message"), BAD_MANIFESTS)
def test_merge_manifests_with_a_field_of_the_wrong_type_is_one_line(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    doc = copy.deepcopy(GOOD)
    edit(doc)
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    (tmp_path / "good.json").write_text(json.dumps(GOOD))
    result = run_cli("merge-manifests", tmp_path / "good.json", tmp_path / "bad.json", "-o", tmp_path / "merged.json")
    assert_one_line_error(result, f"{tmp_path / 'bad.json'}: ", message)
    assert not (tmp_path / "merged.json").exists()


def test_merge_manifests_of_good_files_still_merges(tmp_path: Path) -> None:
    (tmp_path / "good.json").write_text(json.dumps(GOOD))
    result = run_cli("merge-manifests", tmp_path / "good.json", "-o", tmp_path / "merged.json")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "merged.json").read_text()) == GOOD


@pytest.mark.parametrize(("edit", "message"), BAD_MANIFESTS)
def test_the_pinned_tag_is_read_from_a_checked_document_only(
    edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    """``pinned_tag`` (what Lemonade installs for a target) checks the whole document first: one error
    naming the file and the field, never a TypeError or a pin taken from a damaged file."""
    doc = copy.deepcopy(GOOD)
    edit(doc)
    with pytest.raises(BundleError) as err:
        pinned_tag(doc, "gfx1151", "pins.json")
    assert str(err.value).startswith("pins.json: ") and message in str(err.value), str(err.value)
    assert pinned_tag(GOOD, "gfx1151", "pins.json") == TAG


# -- 16: a lock re-signed after an edit (content-sha256 recomputed) ------------------------------------


def _resign(recipes: Path, edit_lock: Callable[[dict[str, Any]], None] | None = None, edit_pylock: Any = None) -> None:
    """Edit the lock (and pylock) and recompute the hashes that tie them together, as a tamperer would."""
    lock_path = recipes / "locks" / "stable" / "gfx1151.toml"
    pylock_path = recipes / "locks" / "stable" / "pylock.gfx1151.toml"
    lock = tomllib.loads(lock_path.read_text())
    if edit_pylock is not None:
        pylock = tomllib.loads(pylock_path.read_text())
        edit_pylock(pylock)
        pylock_path.write_text(tomli_w.dumps(pylock))
        lock["pylock-sha256"] = hashlib.sha256(pylock_path.read_bytes()).hexdigest()
    if edit_lock is not None:
        edit_lock(lock)
    lock["content-sha256"] = content_digest(lock)
    lock_path.write_text(tomli_w.dumps(lock))


@pytest.fixture
def locked_copy(locked: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "recipes"
    shutil.copytree(locked, copy)
    return copy


def _fetch_offline(recipes: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("fetch", "gfx1151", "--recipes", recipes, "--offline", "--cache-dir", recipes.parent / "cache")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("size", "123", "artifacts[0].size is a string, not a whole number of bytes"),
        ("size", -1, "artifacts[0].size is -1, not a whole number of bytes"),
        ("size", True, "artifacts[0].size is a boolean"),
        ("sha256", "../../x", "artifacts[0].sha256 is '../../x', not a sha256"),
        ("sha256", 5, "artifacts[0].sha256 is an integer, not a sha256"),
        ("name", 5, "artifacts[0].name is an integer, not a string"),
        ("url", ["x"], "artifacts[0].url is an array, not a string"),
        ("filename", "../x.tar.gz", "artifacts[0].filename is '../x.tar.gz', not a file name"),
        ("role", {"a": 1}, "artifacts[0].role is a table, not a string"),
    ],
)
def test_a_resigned_lock_with_a_bad_artifact_field_is_one_line(
    locked_copy: Path, field: str, value: Any, message: str
) -> None:
    _resign(locked_copy, edit_lock=lambda doc: doc["artifacts"][0].__setitem__(field, value))
    assert_one_line_error(_fetch_offline(locked_copy), "gfx1151.toml: ", message, "re-lock")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("artifacts", {"x": 1}, "artifacts is a table, not an array of tables"),
        ("artifacts", [5], "artifacts[0] is an integer, not a table"),
        ("source-date-epoch", "1763596800", "source-date-epoch is a string, not a whole number"),
        ("versions", {"rocm": 7}, "versions.rocm is an integer, not a string"),
        ("target", 5, "target is an integer, not a string"),
    ],
)
def test_a_resigned_lock_with_a_bad_top_level_field_is_one_line(
    locked_copy: Path, key: str, value: Any, message: str
) -> None:
    _resign(locked_copy, edit_lock=lambda doc: doc.__setitem__(key, value))
    assert_one_line_error(_fetch_offline(locked_copy), "gfx1151.toml: ", message, "re-lock")


def _first_wheel(pylock: dict[str, Any]) -> dict[str, Any]:
    wheel: dict[str, Any] = next(p for p in pylock["packages"] if p.get("wheels"))["wheels"][0]
    return wheel


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: _first_wheel(p).__setitem__("size", "big"), "].size is a string, not a whole number of bytes"),
        (lambda p: _first_wheel(p).__setitem__("url", 5), "].url is an integer, not a string"),
        (lambda p: _first_wheel(p).__setitem__("name", ["x"]), "].name is an array, not a string"),
        (lambda p: _first_wheel(p).__setitem__("hashes", "x"), "].hashes is a string, not a table"),
        (lambda p: _first_wheel(p)["hashes"].__setitem__("sha256", "../x"), "].hashes.sha256 is '../x', not a sha256"),
        (lambda p: p.__setitem__("packages", {"a": 1}), "packages is a table, not an array of tables"),
        (lambda p: p["packages"][0].__setitem__("wheels", "x"), "packages[0].wheels is a string, not an array"),
        (lambda p: p["packages"][0].__setitem__("name", 5), "packages[0].name is an integer, not a string"),
        (lambda p: p["packages"][0].__setitem__("marker", 5), "packages[0].marker is an integer, not a string"),
    ],
)
def test_a_resigned_pylock_with_a_bad_wheel_field_is_one_line(
    locked_copy: Path, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    _resign(locked_copy, edit_pylock=edit)
    assert_one_line_error(_fetch_offline(locked_copy), "pylock.gfx1151.toml: ", message, "re-lock")


def test_a_lock_with_good_values_still_fetches_offline_to_the_missing_list(locked_copy: Path) -> None:
    _resign(locked_copy, edit_lock=lambda doc: None)
    assert_one_line_error(_fetch_offline(locked_copy), "--offline", "missing from the cache")


# -- #32 E8: $SOURCE_DATE_EPOCH --------------------------------------------------------------------------

#: 9999-12-31T23:59:59Z: the latest second a datetime (the SBOM's timestamp, the image's "created") holds.
LATEST_DATE = 253402300799
#: Stands for a lock: source_date reads only its date.
LOCK = cast(Lock, SimpleNamespace(source_date_epoch=1763596800))


@pytest.mark.parametrize(
    "value", ["99999999999999999999", str(LATEST_DATE + 1), "-1", "1e9", "12.5", " 5", "0x10", "\u00b2", "\u0661\u0662"]
)
def test_a_source_date_epoch_no_output_can_carry_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """Before the fix: 99999999999999999999 passed until the SBOM (OverflowError after the whole build);
    "²" passed str.isdigit and failed int() with a ValueError."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    with pytest.raises(InvalidValueError) as caught:
        source_date(LOCK, None)
    assert str(caught.value).startswith(f"SOURCE_DATE_EPOCH={value!r} is not a whole number of seconds from 0 to ")
    assert f"{LATEST_DATE} (9999-12-31 23:59:59 UTC)" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("value", ["0", "1763596800", str(LATEST_DATE)])
def test_a_source_date_epoch_in_range_is_taken_and_every_output_can_carry_it(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    date = source_date(LOCK, None)
    assert date == int(value)
    assert datetime.fromtimestamp(date, tz=UTC).year <= 9999  # the SBOM's timestamp
    assert iso_time(date).endswith("Z")  # the image config's "created"
    info = tarfile.TarInfo("x")
    info.mtime = date
    with tarfile.open(fileobj=io.BytesIO(), mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info)  # the archive's mtimes
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "")
    assert source_date(LOCK, None) == LOCK.source_date_epoch, "empty: unset, the lock's date"


def test_bundle_with_a_source_date_epoch_out_of_range_is_refused_before_any_stage(locked: Path, tmp_path: Path) -> None:
    build = tmp_path / "build"
    args: list[str | Path] = ["bundle", "gfx1151", "--recipes", locked, "--cache-dir", tmp_path / "cache", "--offline"]
    args += ["--plain", "--build-dir", build, "--bundles-dir", tmp_path / "bundles", "--repo", TEST_REPO]
    result = run_cli(*args, env={"SOURCE_DATE_EPOCH": "99999999999999999999"})
    assert_one_line_error(result, "SOURCE_DATE_EPOCH='99999999999999999999' is not a whole number of seconds")
    assert result.returncode == InvalidValueError.exit_code
    assert "stage" not in result.stdout and not build.exists(), "refused before any stage ran"
