"""Per-rank capture: whole lines into a Sink, routed by the writing thread."""

from __future__ import annotations

import io
import threading

import pytest

from clustersdk.runtime.capture import Sink, _RankStream, bind


def texts(lines):
    return [(stream, text) for _, _, stream, text in lines]


def test_sink_joins_partial_writes_into_whole_lines():
    sink = Sink(rank=2)
    sink.write("stdout", "hel")
    sink.write("stdout", "lo\nwor")
    sink.write("stdout", "ld\n\nnext")
    lines = sink.drain()
    assert texts(lines) == [("stdout", "hello"), ("stdout", "world"), ("stdout", "")]
    assert {rank for rank, *_ in lines} == {2}
    assert sink.drain() == []  # drained lines are gone


def test_streams_keep_separate_partial_lines():
    sink = Sink(rank=0)
    sink.write("stdout", "out ")
    sink.write("stderr", "err\n")
    sink.write("stdout", "done\n")
    assert texts(sink.drain()) == [("stderr", "err"), ("stdout", "out done")]


def test_final_drain_flushes_partial_lines():
    sink = Sink(rank=0)
    sink.write("stdout", "no newline")
    assert sink.drain() == []
    assert texts(sink.drain(final=True)) == [("stdout", "no newline")]
    assert sink.drain(final=True) == []


def test_a_bound_thread_writes_to_its_sink_and_other_threads_to_the_original():
    original = io.StringIO()
    stream = _RankStream(original, "stdout")
    sink = Sink(rank=1)
    bound, main_wrote = threading.Event(), threading.Event()

    def rank_thread():
        bind(sink)
        try:
            bound.set()
            main_wrote.wait(5)
            print("from rank", 1, file=stream)
            stream.write("partial")
        finally:
            bind(None)
        stream.write("after unbind\n")

    t = threading.Thread(target=rank_thread)
    t.start()
    assert bound.wait(5)
    print("from main", file=stream)  # while the other thread is bound
    main_wrote.set()
    t.join(5)

    assert original.getvalue() == "from main\nafter unbind\n"
    assert texts(sink.drain(final=True)) == [("stdout", "from rank 1"), ("stdout", "partial")]


@pytest.mark.parametrize("attr", ["encoding", "fileno", "writable"])
def test_the_stand_in_stream_looks_like_the_original(tmp_path, attr):
    with open(tmp_path / "out.txt", "w", encoding="utf-8") as original:
        stream = _RankStream(original, "stdout")
        value = getattr(original, attr)
        expected = value() if callable(value) else value
        got = getattr(stream, attr)
        assert (got() if callable(got) else got) == expected
