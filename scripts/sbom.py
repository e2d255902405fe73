"""The image's software bill of materials, as CycloneDX 1.5 JSON, read from inside the image.

    python scripts/sbom.py TAG VERSION OUT

Runs one container of TAG (``scripts/image run``) that lists what the image holds: the Python
distributions of its interpreter's environment (the bridge's virtualenv, with the bridge itself)
and the Debian packages dpkg knows. Each becomes a component with its package URL
(``pkg:pypi/…``, ``pkg:deb/debian/…``); the image is the BOM's subject, depending on all of them.
Used by ``scripts/dist``; the ship tests validate its output against the CycloneDX schema.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

IMAGE = Path(__file__).resolve().parent / "image"

# Run inside the image: {"python": [[name, version, license], ...], "debian": [[name, version,
# arch], ...], "debian_version": "12"}.
INSIDE = r"""
import json, subprocess
from importlib import metadata
python = sorted(
    {(d.metadata["Name"], d.version, d.metadata.get("License-Expression")
      or d.metadata.get("License") or "") for d in metadata.distributions()}
)
listed = subprocess.run(
    ["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${Architecture}\n"],
    capture_output=True, text=True, check=True,
).stdout
release = dict(
    line.split("=", 1) for line in open("/etc/os-release").read().splitlines() if "=" in line
)
print(json.dumps({
    "python": python,
    "debian": [line.split("\t") for line in listed.splitlines() if line],
    "debian_version": release.get("VERSION_ID", "").strip('"'),
}))
"""


def pypi_purl(name: str, version: str) -> str:
    """A Python distribution's package URL (names normalised as PyPI's)."""
    normal = name.lower().replace("_", "-").replace(".", "-")
    return f"pkg:pypi/{quote(normal)}@{quote(version)}"


def deb_purl(name: str, version: str, arch: str, debian_version: str) -> str:
    """A Debian package's package URL."""
    distro = f"&distro=debian-{debian_version}" if debian_version else ""
    return f"pkg:deb/debian/{quote(name)}@{quote(version)}?arch={quote(arch)}{distro}"


def bom(listing: dict[str, Any], version: str, now: datetime) -> dict[str, Any]:
    """The CycloneDX document for an image holding what ``listing`` names."""
    components: list[dict[str, Any]] = []
    for name, dist_version, license_text in listing["python"]:
        purl = pypi_purl(name, dist_version)
        component: dict[str, Any] = {
            "type": "library",
            "bom-ref": purl,
            "name": name,
            "version": dist_version,
            "purl": purl,
        }
        if license_text and len(license_text) < 100:  # a name, not a licence's whole text
            component["licenses"] = [{"license": {"name": license_text}}]
        components.append(component)
    for name, deb_version, arch in listing["debian"]:
        purl = deb_purl(name, deb_version, arch, listing["debian_version"])
        components.append(
            {"type": "library", "bom-ref": purl, "name": name, "version": deb_version, "purl": purl}
        )
    image = {
        "type": "container",
        "bom-ref": f"delay-bridge@{version}",
        "name": "delay-bridge",
        "version": version,
    }
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": {"components": [{"type": "application", "name": "scripts/sbom.py"}]},
            "component": image,
        },
        "components": components,
        "dependencies": [
            {"ref": image["bom-ref"], "dependsOn": [c["bom-ref"] for c in components]},
            *({"ref": c["bom-ref"]} for c in components),
        ],
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: sbom.py TAG VERSION OUT", file=sys.stderr)
        return 2
    tag, version, out = argv
    proc = subprocess.run(
        [str(IMAGE), "run", tag, "python", "-c", INSIDE],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        print(f"sbom.py: listing the image's packages failed: {proc.stderr}", file=sys.stderr)
        return 1
    document = bom(json.loads(proc.stdout), version, datetime.now(UTC))
    Path(out).write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
