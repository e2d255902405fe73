"""delay-bridge: delayed delivery for Apache Kafka, backed by Redis."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("delay-bridge")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
