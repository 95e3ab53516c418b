"""How `dlcp launch` splits a rank's output into prefixed lines."""

from __future__ import annotations

import io

from dlcp.launch import MAX_LINE, _Output


def lines_of(*chunks: bytes) -> list[str]:
    sink = io.StringIO()
    out = _Output(b"[r0] ", sink)
    for chunk in chunks:
        out.feed(chunk)
    shown = sink.getvalue()
    out.close()
    return [shown, sink.getvalue()]  # (what was shown before close, and after)


def test_newlines_split_and_a_partial_line_waits_for_its_end() -> None:
    before, after = lines_of(b"one\ntw", b"o\nthr")
    assert before == "[r0] one\n[r0] two\n"
    assert after == before + "[r0] thr\n"


def test_a_carriage_return_ends_a_line_but_crlf_is_one_end() -> None:
    # a progress bar redraws its line with '\r': each redraw is shown as it comes
    before, _ = lines_of(b" 10%\r 20%\r", b"\ndone\r\n")
    assert before == "[r0]  10%\n[r0]  20%\n[r0] done\n"


def test_a_line_that_never_ends_is_shown_in_pieces() -> None:
    before, after = lines_of(b"x" * (2 * MAX_LINE + 5))
    assert before == ("[r0] " + "x" * MAX_LINE + "\n") * 2
    assert after == before + "[r0] xxxxx\n"


def test_a_line_the_rank_labelled_itself_is_not_labelled_again() -> None:
    # torch's excepthook (after init_process_group) labels each traceback line
    # "[rank0]: ", and its C++ warnings "[rank0]:[W...]"; a line labelled for another
    # rank, or with the label later in the line, is still this rank's output
    sink = io.StringIO()
    out = _Output(b"[rank0]: ", sink)
    out.feed(
        b"[rank0]: Traceback (most recent call last):\n"
        b"[rank0]:[W1128 warn.cpp:1] Warning: x\n"
        b"plain\n"
        b"[rank1]: from another rank\n"
        b"see [rank0]: later\n"
    )
    assert sink.getvalue() == (
        "[rank0]: Traceback (most recent call last):\n"
        "[rank0]:[W1128 warn.cpp:1] Warning: x\n"
        "[rank0]: plain\n"
        "[rank0]: [rank1]: from another rank\n"
        "[rank0]: see [rank0]: later\n"
    )


def test_without_a_prefix_lines_pass_as_they_are() -> None:
    sink = io.StringIO()
    out = _Output(b"", sink)
    out.feed(b"[rank0]: x\ny\n")
    assert sink.getvalue() == "[rank0]: x\ny\n"
