"""Play upstream by hand: ``python -m tests.upstream.serve DIR`` builds the fake upstream, serves it on
127.0.0.1 with a real registry holding the image base, writes a copy of the recipes locked against
them, and prints the ``nox`` commands that build, image and push against them. Ctrl-C stops it.

What the test suite does through fixtures, for trying the pipeline (or quoting it) on a machine that
cannot reach GitHub, AMD's indexes or Red Hat's registry.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from pathlib import Path

from tests.conftest import TEST_CACHE, TEST_DOWNLOADS, TEST_REPO, bundle_args, copy_recipes, lock_against, run_cli
from tests.upstream.fixture import CP, build_fixture
from tests.upstream.real_wheels import real_wheels
from tests.upstream.registry import RegistryServer, push_base, write_base_layout
from tests.upstream.server import UpstreamServer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="an empty work directory")
    work = parser.parse_args().dir.resolve()
    real = real_wheels(TEST_DOWNLOADS, CP, work / "real")
    fixture = build_fixture(work / "upstream", real, cache=TEST_CACHE / "fixture")
    upstream = UpstreamServer(fixture.root).start()
    registry = RegistryServer(work / "registry").start()
    try:
        recipes = copy_recipes(work / "recipes")
        locked = lock_against(upstream, recipes, "gfx1151", work / "cache")
        if locked.returncode != 0:
            sys.exit(locked.stderr)
        # The base holds the system libraries the bundle loads: build one bundle to know them.
        seed = run_cli(
            *bundle_args(recipes, upstream, work / "seed" / "build", work / "cache"), "--no-archive", timeout=900
        )
        if seed.returncode != 0:
            sys.exit(seed.stderr)
        push_base(registry, write_base_layout(work / "base", work / "seed" / "build" / "gfx1151" / "root"))
        options = bundle_args(recipes, upstream, work / "build", work / "cache")[2:]
        for option in ("--build-dir", "--bundles-dir"):  # each run names its own
            at = options.index(option)
            del options[at : at + 2]
        options += ["--registry-mirror", registry.host]
        print(
            f"fake upstream {upstream.url}, registry {registry.url} (base ubi10/ubi-minimal:latest); repo {TEST_REPO}"
        )
        print("try:")
        print(f"  nox -s image -- gfx1151 {shlex.join(options)} --build-dir {work}/a --bundles-dir {work}/a/bundles")
        print(f"  ... --push {registry.host}/example/vllm-rocm")
        sys.stdout.flush()
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    finally:
        registry.stop()
        upstream.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
