"""What the client API asks of the tiers above it, provided by them.

The client API (:class:`~clustersdk.Cluster`, :class:`~clustersdk.Job`) sits below
the presentation (``widgets/``, magics, the CLI) and the tools built on the client
(the doctor), and never imports them: a lower layer that imports a higher one ties
both into one knot. Yet a job shows as a live dashboard in a notebook,
``job.console()`` is a widget, ``cluster.queue()`` is an HTML table and
``cluster.doctor()`` runs the doctor. So those methods call a *hook* by name, and
the tier above provides it. ``clustersdk/__init__.py`` (the package's face, which
every import of ``clustersdk`` runs first) provides each one as a small function
that imports its module on first use: ``import clustersdk`` stays cheap, and a plain
``python script.py`` gets what a notebook gets.

IPython's display formatters (``for_type_by_name``) were the other way to let
presentation register itself; they reach only the notebook reprs, and only in an
IPython shell that exists when ``clustersdk`` is imported. ``job.console()`` and
``cluster.doctor()`` are methods that must work the same in a script, and
``job._repr_mimebundle_()`` the same in a test: one registry covers all of them.

The hooks, what they are called with, and what they return:

- ``job_display(job, include, exclude)``: the job's mimebundle (its dashboard)
- ``cluster_display(cluster, include, exclude)``: the cluster's mimebundle
- ``job_console(job, rank)``: the console of the job's pdb sessions
- ``queue_text(data)`` and ``queue_html(data)``: ``cluster.queue()`` as text, HTML
- ``doctor(client, **options)``: the doctor's report

>>> from clustersdk import hooks
>>> hooks.provide("example", lambda name: f"hello {name}")
>>> hooks.call("example", "rank 0")
'hello rank 0'
>>> _ = hooks.withdraw("example")

Pure: it imports nothing, so every tier may use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_providers: dict[str, Callable[..., Any]] = {}


class HookMissingError(LookupError):
    """No tier provides the hook that was called (``clustersdk`` was not imported as a
    package, or a test removed the provider)."""


def provide(name: str, provider: Callable[..., Any]) -> Callable[..., Any] | None:
    """Make ``provider`` answer hook ``name``; return the provider it replaced (or None),
    so that a test can put it back."""
    if not callable(provider):
        raise TypeError(f"hook {name!r}: the provider must be callable, got {provider!r}")
    previous = _providers.get(name)
    _providers[name] = provider
    return previous


def withdraw(name: str) -> Callable[..., Any] | None:
    """Remove the provider of hook ``name``; return it (None if there was none)."""
    return _providers.pop(name, None)


def provided(name: str) -> bool:
    """Whether some tier provides hook ``name``."""
    return name in _providers


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    """Call the provider of hook ``name`` with these arguments and return its answer."""
    try:
        provider = _providers[name]
    except KeyError:
        raise HookMissingError(
            f"nothing provides the hook {name!r} (known: {sorted(_providers) or 'none'}); "
            "clustersdk/__init__.py provides the package's own when clustersdk is imported"
        ) from None
    return provider(*args, **kwargs)
