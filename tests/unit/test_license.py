"""The licence the package declares is the one the repository ships."""

from __future__ import annotations

import tomllib

from tests.conftest import ROOT


def test_license_file_matches_pyproject() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    text = (ROOT / "LICENSE").read_text()
    assert declared == "Apache-2.0"
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
