"""The package's version (one place: the package face and the wheel's metadata read it)."""

__version__ = "0.1.0"
