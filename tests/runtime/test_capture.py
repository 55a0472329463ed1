"""A rank's output: whole lines into a Sink, from the pieces its pipes give."""

from __future__ import annotations

from clustersdk.runtime.capture import LINE_LIMIT, TAIL, Sink


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


def test_bytes_from_a_pipe_are_decoded_across_reads():
    sink = Sink(rank=0)
    data = "grüße\n".encode()
    sink.write_bytes("stdout", data[:3])  # "ü" is cut in two
    sink.write_bytes("stdout", data[3:] + b"bad \xff byte\n")
    assert texts(sink.drain()) == [("stdout", "grüße"), ("stdout", "bad \ufffd byte")]


def test_a_line_without_end_is_cut_at_the_limit():
    sink = Sink(rank=0)
    bar = "#" * (LINE_LIMIT + 10)  # a progress bar redrawn with \r, never a newline
    assert sink.write("stderr", bar) == 1
    [(_, _, _, line)] = sink.drain()
    assert line == "#" * LINE_LIMIT
    assert texts(sink.drain(final=True)) == [("stderr", "#" * 10)]


def test_the_tail_of_each_stream_is_kept_for_a_failures_record():
    sink = Sink(rank=0)
    for i in range(TAIL + 5):
        sink.write("stderr", f"line {i}\n")
    sink.write("stdout", "elsewhere\n")
    sink.write("stderr", "unfinished")
    sink.drain()  # shipped: the tail stays
    assert sink.tail("stderr") == [f"line {i}" for i in range(6, TAIL + 5)] + ["unfinished"]
    assert sink.tail("log") == []
