"""The fixes to TheRock's installed ROCm SDK (patches/rocm-sdk): chosen by the SDK version installed,
applied all or nothing, re-checked by tier 0 (test_qualify.py's planted defects)."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from tests.conftest import REPO
from tests.upstream.therock import ROCM_SDK_INIT
from vllm_bundle.errors import PatchError
from vllm_bundle.tree.patches import apply_fixes, fixes_not_applied, read_series

SERIES = read_series(REPO / "patches" / "rocm-sdk")


def _site(tmp_path: Path, text: str = ROCM_SDK_INIT) -> Path:
    site = tmp_path / "site-packages"
    (site / "rocm_sdk").mkdir(parents=True)
    (site / "rocm_sdk" / "__init__.py").write_text(text)
    return site


@pytest.mark.parametrize(
    ("version", "status"),
    [("10.0.0", "applied"), ("7.14.0", "applied"), ("10.1.0a20261126", "applied"), ("7.10.0a20251124", "not needed")],
)
def test_a_fix_is_applied_where_the_sdk_version_needs_it(version: str, status: str, tmp_path: Path) -> None:
    """rtld-local: needed from 7.12 on (the amdsmi collision, ROCm/TheRock#3487); the legacy per-family
    nightlies' 7.10 are before it."""
    site = _site(tmp_path)
    (outcome,) = apply_fixes(site, SERIES, Version(version))
    assert (outcome.patch_id, outcome.status) == ("rtld-local", status)
    text = (site / "rocm_sdk" / "__init__.py").read_text()
    assert text.count("rtld_global: bool = False") == (2 if status == "applied" else 0)
    assert fixes_not_applied(site, SERIES, Version(version)) == []
    (again,) = apply_fixes(site, SERIES, Version(version))
    assert again.status == ("already applied" if status == "applied" else "not needed")


def test_a_fix_that_no_longer_fits_fails_naming_the_hunk_and_leaves_the_file(tmp_path: Path) -> None:
    """A TheRock release whose signature moved: the stage fails in one line, the file as it was."""
    stock = ROCM_SDK_INIT.replace("rtld_global: bool = True,", "rtld_global: bool = True,  # moved", 1)
    site = _site(tmp_path, stock)
    with pytest.raises(PatchError) as failed:
        apply_fixes(site, SERIES, Version("10.0.0"))
    assert "rtld-local.patch (rtld-local) does not apply to the ROCm SDK 10.0.0: rocm_sdk/__init__.py" in str(
        failed.value
    )
    assert "patches/rocm-sdk/README.md" in failed.value.hint
    assert (site / "rocm_sdk" / "__init__.py").read_text() == stock
    assert [p.id for p in fixes_not_applied(site, SERIES, Version("10.0.0"))] == ["rtld-local"]
