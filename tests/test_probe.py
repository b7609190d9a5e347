"""``vllm-bundle probe`` against the fake upstream. The fake is built from tests/upstream/facts.toml, so it
agrees with every fact; a fake changed in one fact (or a fact changed under the same fake) has that fact,
and only it, named with its source."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, assert_one_line_error, run_cli
from tests.upstream.fixture import (
    PYPI,
    THEROCK_MULTI_ARCH,
    THEROCK_NEXT,
    THEROCK_NIGHTLY,
    THEROCK_PER_FAMILY,
)
from tests.upstream.server import Fault, UpstreamServer

FACTS = REPO / "tests" / "upstream" / "facts.toml"
INDEX = {
    "stable": THEROCK_NEXT,
    "nightly": THEROCK_NIGHTLY,
    "frozen-7.14": THEROCK_MULTI_ARCH,
    "nightly-legacy": THEROCK_PER_FAMILY,
}


def _probe(
    upstream: UpstreamServer, recipes: Path, channel: str = "stable", *extra: str | Path
) -> subprocess.CompletedProcess[str]:
    return run_cli(
        *("probe", "gfx1151", "--channel", channel, "--recipes", recipes),
        *("--therock-index", f"{upstream.url}/{INDEX.get(channel, THEROCK_NEXT)}/"),
        *("--pypi-index", f"{upstream.url}/{PYPI}/", "--mirror", f"{upstream.url}/releases/", *extra),
    )


def _differences(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("differs  ")]


@pytest.mark.parametrize("channel", list(INDEX))
def test_the_fake_upstream_agrees_with_every_fact(upstream: UpstreamServer, recipes_dir: Path, channel: str) -> None:
    result = _probe(upstream, recipes_dir, channel)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _differences(result) == []
    checked = re.search(
        rf"(?m)^ok     (\d+) facts of {re.escape(str(FACTS))} agree with what channel {channel}", result.stdout
    )
    assert checked and int(checked[1]) > 40, result.stdout
    asked = {r.path for r in upstream.log}
    index = INDEX[channel].format(family="gfx1151")
    assert f"/{index}/vllm-bundle-probe-no-such-project/" in asked, "the missing-page status was asked for"
    assert "/releases/SHA256SUMS" in asked, "the CPython asset was looked up in its release's checksums"
    torch = [r for r in upstream.log if r.path.startswith("/files/torch-2.")]
    assert torch and all(r.range or r.method == "HEAD" for r in torch), "torch's METADATA read by range, not downloaded"
    if channel in ("stable", "nightly"):
        assert f"/therock/{channel}/pytorch/whl-next/torch/" in asked, "each package's owner index was asked"


# A change to the fake upstream, as the real one may differ (on channel frozen-7.14's index):
# (how, where, the line the probe must print).
FAKE_CHANGES = {
    "repo.amd.com answers 404": (
        "status",
        f"/{THEROCK_MULTI_ARCH}/",
        "differs  TheRock whl-multi-arch answers HTTP 403 for a project it does not have; found: HTTP 404",
    ),
    "a family device package is gone": (
        "fault",
        f"/{THEROCK_MULTI_ARCH}/amd-torch-device-gfx11/",
        "differs  TheRock whl-multi-arch serves amd-torch-device-gfx11; found: no project page",
    ),
}


@pytest.mark.parametrize("change", FAKE_CHANGES, ids=list(FAKE_CHANGES))
def test_a_fake_changed_in_one_fact_has_that_fact_named(
    upstream: UpstreamServer, recipes_dir: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    how, path, expected = FAKE_CHANGES[change]
    if how == "status":
        monkeypatch.setitem(upstream.missing_status, path, 404)
    else:
        upstream.inject(path, Fault("status", times=None, status=403))
    result = _probe(upstream, recipes_dir, "frozen-7.14")
    assert_one_line_error(result, "1 of", "facts of", "differ from what channel frozen-7.14 serves")
    assert [line.partition("  [fact from:")[0] for line in _differences(result)] == [expected]


def test_a_package_that_left_its_owners_index_is_named(upstream: UpstreamServer, recipes_dir: Path) -> None:
    upstream.inject("/therock/stable/pytorch/whl-next/torchvision/", Fault("status", times=None, status=404))
    result = _probe(upstream, recipes_dir, "stable")
    assert_one_line_error(result, "1 of")
    (line,) = _differences(result)
    assert "torchvision is published in pytorch's index" in line and "found: HTTP 404" in line
    assert "aggregate_index.py" in line, "the fact's source is cited"


_MANAGE = (
    'sha256-fragments-source = "ROCm/TheRock@89553ce build_tools/third_party/s3_management/manage.py '
    "to_simple_package_html: #sha256="
)

# A fact changed under the same fake, probed on channel frozen-7.14's index (whl-multi-arch): (the fact as
# it was, as it is changed, what the line names).
FACT_CHANGES = {
    "torch's SDK pin": (
        '"rocm[libraries]=={rocm}", "triton=={triton}", "rocm-bootstrap"',
        '"rocm[libraries]==9.9.9", "triton=={triton}", "rocm-bootstrap"',
        "requires rocm[libraries]==9.9.9; found: rocm[libraries]==7.14.0",
    ),
    "where device code lives": (
        '"_rocm_sdk_libraries/.kpack/blas_lib_{isa}.kpack", "_rocm_sdk_libraries/.devel_links',
        '"_rocm_sdk_libraries/lib/blas_lib_{isa}.kpack", "_rocm_sdk_libraries/.devel_links',
        "ships _rocm_sdk_libraries/lib/blas_lib_gfx1151.kpack; found: not in the wheel",
    ),
    "a CUDA library PyPI's torchvision needs": (
        '"torchvision/_C.so" = ["libcudart.so.13"',
        '"torchvision/_C.so" = ["libcudnn.so.9"',
        "torchvision/_C.so needs libcudnn.so.9; found: libcudart.so.13",
    ),
    "the SDK's wheel tag": (
        'name = "rocm-sdk-core"\nowner = "core"\ntag = "py3-none-linux_x86_64"',
        'name = "rocm-sdk-core"\nowner = "core"\ntag = "py3-none-manylinux_2_28_x86_64"',
        "tagged py3-none-manylinux_2_28_x86_64; found: rocm_sdk_core-",
    ),
    "torch's family device packages": (
        'torch-device-bundles = ["gfx11", "gfx12-0"]',
        'torch-device-bundles = ["gfx12-0"]',
        "[device-gfx1151] requires amd-torch-device-gfx1151==",
    ),
    "which pages carry hashes": (
        f'sha256-fragments = "some"\n{_MANAGE} only',
        f'sha256-fragments = "always"\n{_MANAGE} only',
        "gives #sha256 fragments: always; found: some (",
    ),
}


@pytest.mark.parametrize("change", FACT_CHANGES, ids=list(FACT_CHANGES))
def test_a_fact_the_fake_does_not_bear_out_is_named_with_its_source(
    upstream: UpstreamServer, recipes_dir: Path, tmp_path: Path, change: str
) -> None:
    before, after, named = FACT_CHANGES[change]
    text = FACTS.read_text()
    assert text.count(before) == 1, f"premise: the facts file has {before!r} once"
    changed = tmp_path / "facts.toml"
    changed.write_text(text.replace(before, after))
    result = _probe(upstream, recipes_dir, "frozen-7.14", "--facts", changed)
    assert_one_line_error(result, "1 of", str(changed))
    (line,) = _differences(result)
    assert named in line, line
    assert "[fact from: " in line and line.rstrip().endswith("]"), "each line cites where the fact was read"


def test_a_channel_the_facts_do_not_model_is_one_line(upstream: UpstreamServer, recipes_dir: Path) -> None:
    channels = recipes_dir / "channels.toml"
    stable = channels.read_text().split("[channels.nightly]")[0].split("[channels.stable]")[1]
    channels.write_text(channels.read_text() + "[channels.mine]" + stable.replace("channels.stable.", "channels.mine."))
    result = _probe(upstream, recipes_dir, "mine")
    assert_one_line_error(
        result, "models no TheRock index of channel mine", "stable, nightly, frozen-7.14, nightly-legacy"
    )
    assert upstream.log == [], "nothing asked before the facts say what to ask"


def test_a_malformed_facts_file_is_one_line(upstream: UpstreamServer, recipes_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "facts.toml"
    broken.write_text(FACTS.read_text().replace("missing-project = 403\n", "", 1))
    result = _probe(upstream, recipes_dir, "stable", "--facts", broken)
    assert_one_line_error(result, f"bad facts file {broken}", "missing-project")
