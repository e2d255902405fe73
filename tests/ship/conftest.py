"""What the shipping tests share: helm, installed (pinned, cached) if missing; the image built
from this checkout, once (each build is minutes of CPU and hundreds of MB)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="session")
def helm() -> str:
    subprocess.run([str(ROOT / "scripts" / "tools"), "helm"], check=True)
    out = subprocess.run(
        [str(ROOT / "scripts" / "tools"), "path", "helm"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


@pytest.fixture(scope="session")
def image() -> Iterator[str]:
    """The image built from this checkout (`scripts/image build`), under a tag of its own;
    removed afterwards."""
    script = ROOT / "scripts" / "image"
    subprocess.run([str(ROOT / "scripts" / "tools"), "buildah"], check=True)
    tag = f"localhost/delay-bridge:test-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run([str(script), "build", tag], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    yield tag
    subprocess.run([str(script), "rmi", tag], check=True)
