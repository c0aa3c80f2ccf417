"""The receiver: verified, durable intake of the upstream service's webhooks and their delivery.

``__version__`` is the release (semantic versioning, see CHANGELOG.md) and the one place it is
written: the package's metadata reads it from here when the package is built.
"""

__version__ = "0.5.0"
