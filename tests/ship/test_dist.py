"""`make dist`'s artifacts (scripts/dist): the wheel installed in a fresh virtualenv runs, the
sdist holds the package data, the image's OCI archive and its CycloneDX SBOM, and SHA256SUMS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest
import yaml
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

import bridge
from tests.conftest import ROOT

pytestmark = pytest.mark.ship

VERSION = bridge.__version__
LUA = sorted(p.name for p in (ROOT / "bridge/store/lua").glob("*.lua"))


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory, image: str) -> Path:
    """`scripts/dist OUT` run as `make dist` runs it, with the image the shipping tests built
    (``DIST_BUILT``: `scripts/image build` is the image tests' to check)."""
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "PYTHON": sys.executable, "DIST_BUILT": image}
    proc = subprocess.run(
        [str(ROOT / "scripts" / "dist"), str(out)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return out


def test_dist_holds_each_artifact_with_its_checksum(dist: Path) -> None:
    names = sorted(p.name for p in dist.iterdir())
    assert names == sorted(
        [
            "SHA256SUMS",
            f"delay-bridge-{VERSION}.cdx.json",
            f"delay-bridge-{VERSION}.oci.tar",
            f"delay_bridge-{VERSION}-py3-none-any.whl",
            f"delay_bridge-{VERSION}.tar.gz",
        ]
    )
    listed = (dist / "SHA256SUMS").read_text().split("\n")
    assert sorted(line.split()[1] for line in listed if line) == [
        n for n in names if n != "SHA256SUMS"
    ]
    check = subprocess.run(
        ["sha256sum", "-c", "SHA256SUMS"], cwd=dist, capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    # A byte changed is caught.
    wheel = dist / f"delay_bridge-{VERSION}-py3-none-any.whl"
    copy = dist.parent / "tampered"
    copy.mkdir(exist_ok=True)
    (copy / "SHA256SUMS").write_text((dist / "SHA256SUMS").read_text())
    for path in dist.iterdir():
        if path.name != "SHA256SUMS":
            data = bytearray(path.read_bytes())
            if path == wheel:
                data[-1] ^= 1
            (copy / path.name).write_bytes(bytes(data))
    tampered = subprocess.run(
        ["sha256sum", "-c", "SHA256SUMS"], cwd=copy, capture_output=True, check=False
    )
    assert tampered.returncode != 0


def test_the_wheel_installs_in_a_fresh_virtualenv_and_runs(dist: Path, tmp_path: Path) -> None:
    wheel = dist / f"delay_bridge-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as whl:
        held = whl.namelist()
    assert {f"bridge/store/lua/{name}" for name in LUA} <= set(held)
    assert "bridge/py.typed" in held and "bridge/console/static/console.js" in held
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    cli = env_dir / "bin" / "delay-bridge"
    version = subprocess.run(
        [str(cli), "--version"], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"delay-bridge {VERSION}"
    config = tmp_path / "bridge.yaml"
    config.write_text((ROOT / "config" / "bridge.yaml").read_text())
    checked = subprocess.run(
        [str(cli), "check-config", "-c", str(config)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr
    assert yaml.safe_load(checked.stdout)["topics"]["delay"] == ["delay"]
    # The installed package, not this checkout: its scripts are read from the venv.
    where = subprocess.run(
        [str(python), "-c", "import bridge.store, sys; print(bridge.store.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert where.stdout.startswith(str(env_dir)), where.stdout


def test_the_sdist_builds_the_same_package(dist: Path) -> None:
    with tarfile.open(dist / f"delay_bridge-{VERSION}.tar.gz") as sdist:
        names = sdist.getnames()
    top = f"delay_bridge-{VERSION}"
    assert {f"{top}/bridge/store/lua/{name}" for name in LUA} <= set(names)
    assert {f"{top}/pyproject.toml", f"{top}/README.md", f"{top}/LICENSE"} <= set(names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_image_archive_and_its_sbom(dist: Path) -> None:
    with tarfile.open(dist / f"delay-bridge-{VERSION}.oci.tar") as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
    [manifest] = index["manifests"]
    assert manifest["annotations"]["org.opencontainers.image.ref.name"] == f"delay-bridge:{VERSION}"
    text = (dist / f"delay-bridge-{VERSION}.cdx.json").read_text()
    error = JsonStrictValidator(SchemaVersion.V1_5).validate_str(text)
    assert error is None, str(error)[:2000]
    sbom = json.loads(text)
    assert sbom["metadata"]["component"]["name"] == "delay-bridge"
    assert sbom["metadata"]["component"]["version"] == VERSION
    purls = {c["name"]: c["purl"] for c in sbom["components"]}
    # What the image holds, read inside it: the bridge and its dependencies, and Debian's part.
    assert purls["delay-bridge"] == f"pkg:pypi/delay-bridge@{VERSION}"
    for name in ("confluent-kafka", "redis", "PyYAML", "prometheus_client"):
        assert purls[name].startswith("pkg:pypi/"), name
    assert purls["tini"].startswith("pkg:deb/debian/tini@")
    assert purls["python3"].startswith("pkg:deb/debian/python3@")
    [top] = [
        d for d in sbom["dependencies"] if d["ref"] == sbom["metadata"]["component"]["bom-ref"]
    ]
    assert len(top["dependsOn"]) == len(sbom["components"])
