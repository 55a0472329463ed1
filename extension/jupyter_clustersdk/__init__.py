"""Jupyter server extension for clustersdk (REST, metrics, health).

Only the package exists so far; the extension app arrives with its own issue.
"""

__version__ = "0.1.0"
