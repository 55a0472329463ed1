"""The exception tree: messages a user can act on."""

from __future__ import annotations

from clustersdk.errors import ClusterSDKError, JobFailedError, JobNotFoundError, SpecError

TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 3, in train\n'


def test_job_failed_error_names_rank_type_message_and_traceback():
    error = JobFailedError("train-1", 3, "ZeroDivisionError", "division by zero", TRACEBACK)
    text = str(error)
    assert "job 'train-1' failed: rank 3 raised ZeroDivisionError: division by zero" in text
    assert text.endswith(f"Remote traceback (rank 3):\n{TRACEBACK}")
    assert (error.rank, error.exc_type, error.message, error.traceback) == (
        3,
        "ZeroDivisionError",
        "division by zero",
        TRACEBACK,
    )


def test_job_failed_error_from_a_journal_record():
    record = {"rank": 0, "type": "KeyError", "message": "'x'", "traceback": TRACEBACK}
    error = JobFailedError.from_record("j", record)
    assert (error.job, error.rank, error.exc_type) == ("j", 0, "KeyError")
    assert isinstance(error, ClusterSDKError)


def test_job_not_found_message_is_not_quoted_like_a_key_error():
    assert str(JobNotFoundError("no job named 'x'")) == "no job named 'x'"
    assert isinstance(JobNotFoundError("x"), KeyError)


def test_spec_error_is_a_value_error():
    assert issubclass(SpecError, ValueError) and issubclass(SpecError, ClusterSDKError)
