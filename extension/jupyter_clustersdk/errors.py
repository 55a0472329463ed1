"""Errors of the server extension, on top of :mod:`clustersdk.errors`.

::

    ClusterSDKError                      (clustersdk.errors)
     ├── BadRequestError (also ValueError)   a query or body the API can't accept   -> 400
     ├── ClusterNotFoundError (also KeyError) no cluster with that id is known      -> 404
     └── UpstreamError                       the scheduler could not answer         -> 502
          ├── SchedulerUnavailableError         unreachable, closed, or timed out
          └── UnsupportedOperationError         the scheduler's clustersdk lacks the op

:func:`http_status` maps these and the SDK's own errors (``SpecError`` and
``CapacityError`` -> 400, ``AccessDeniedError`` -> 403 (the Jupyter user's identity
may not do that to the job: not theirs), ``JobNotFoundError`` -> 404, ``InvalidTransitionError``
-> 409, ``CheckpointError`` -> 502, ``JobTimeoutError`` -> 504) to an HTTP status and
a short machine-readable code.
"""

from __future__ import annotations

from clustersdk.errors import (
    AccessDeniedError,
    CapacityError,
    CheckpointError,
    ClusterSDKError,
    InvalidTransitionError,
    JobNotFoundError,
    JobTimeoutError,
    SpecError,
)


class BadRequestError(ClusterSDKError, ValueError):
    """A query parameter or request body is malformed."""


class ClusterNotFoundError(ClusterSDKError, KeyError):
    """No registered or configured cluster has that id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UpstreamError(ClusterSDKError):
    """A scheduler could not give an answer (the extension itself is fine)."""


class SchedulerUnavailableError(UpstreamError):
    """The scheduler can't be reached, closed the connection, or timed out."""


class UnsupportedOperationError(UpstreamError):
    """The scheduler's control plane has no handler for the operation (older clustersdk)."""


# (error class, HTTP status, code), most specific first
_STATUS: tuple[tuple[type[BaseException], int, str], ...] = (
    (BadRequestError, 400, "bad_request"),
    (SpecError, 400, "bad_request"),
    (CapacityError, 400, "capacity"),
    (AccessDeniedError, 403, "forbidden"),
    (ClusterNotFoundError, 404, "cluster_not_found"),
    (JobNotFoundError, 404, "job_not_found"),
    (InvalidTransitionError, 409, "invalid_transition"),
    (CheckpointError, 502, "checkpoint_failed"),
    (JobTimeoutError, 504, "timeout"),
    (UnsupportedOperationError, 502, "unsupported_operation"),
    (SchedulerUnavailableError, 502, "scheduler_unavailable"),
    (UpstreamError, 502, "scheduler_error"),
)

KNOWN_ERRORS: tuple[type[BaseException], ...] = tuple(cls for cls, _, _ in _STATUS)


def http_status(error: BaseException) -> tuple[int, str]:
    """``(status, code)`` for a known error; ``(500, "internal")`` for anything else.

    >>> http_status(JobNotFoundError("no job 'x'"))
    (404, 'job_not_found')
    """
    for cls, status, code in _STATUS:
        if isinstance(error, cls):
            return status, code
    return 500, "internal"
