"""What the shipping tests share: helm, installed (pinned, cached) if missing."""

from __future__ import annotations

import subprocess

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
