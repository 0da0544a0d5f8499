"""The installed distribution's version, or the source tree's when not installed."""

from importlib import metadata

try:
  __version__ = metadata.version("memeff-jax")
except metadata.PackageNotFoundError:  # a source checkout on sys.path, not installed
  __version__ = "0.2.0.dev0"
