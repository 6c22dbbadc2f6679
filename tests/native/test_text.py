"""The text module: streaming-safe UTF-8 and stop strings (lmsp.native.TextStream)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmsp.native import TextStream


def feed(stream: TextStream, chunks: list[bytes]) -> list[str]:
    return [stream.push(c) for c in chunks]


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in zip(points, points[1:])]


def test_a_character_split_across_pieces_is_released_whole() -> None:
    s = TextStream()
    assert feed(s, [b"\xe6", b"\x97", b"\xa5"]) == ["", "", "日"]
    assert feed(s, [b"a\xf0\x9f", b"\x98\x80b"]) == ["a", "😀b"]
    assert s.flush() == ""
    assert s.emitted == "日a😀b"


def test_invalid_bytes_become_replacement_characters() -> None:
    s = TextStream()
    assert s.push(b"a\x80b\xff") == "a\ufffdb\ufffd"
    assert s.push(b"\xed\xa0\x80") == "\ufffd" * 3  # an encoded surrogate
    assert s.push(b"\xe6\x97") == ""
    assert s.flush() == "\ufffd"  # incomplete at the end


def test_a_nul_becomes_a_replacement_character() -> None:
    # a token of byte 0 (a byte-fallback piece, GPT-2's "Ā"): the text goes back
    # into a later turn's prompt, which refuses NUL characters
    s = TextStream()
    assert s.push(b"a\x00b") == "a\ufffdb"
    assert s.push(b"\x00") == "\ufffd"
    assert s.flush() == ""


@settings(max_examples=200, deadline=None, database=None)
@given(st.binary(max_size=64), st.lists(st.integers(min_value=0, max_value=64), max_size=8))
def test_any_bytes_in_any_pieces_decode_like_python(data: bytes, cuts: list[int]) -> None:
    s = TextStream()
    out = "".join(feed(s, split(data, cuts))) + s.flush()
    assert out == data.decode("utf-8", "replace").replace("\x00", "\ufffd")
    assert s.emitted == out


def test_text_that_may_start_a_stop_string_is_held_back() -> None:
    s = TextStream(["END"])
    assert s.push(b"abc E") == "abc "
    assert s.push(b"N") == ""
    assert s.push(b"d") == "ENd"  # not the stop string after all
    assert s.push(b" E") == " "
    assert s.push(b"ND tail") == ""
    assert s.stopped
    assert s.push(b"more") == ""
    assert s.flush() == ""
    assert s.emitted == "abc ENd "


def test_held_text_is_released_by_flush() -> None:
    s = TextStream(["STOP"])
    assert s.push(b"go ST") == "go "
    assert s.flush() == "ST"
    assert not s.stopped


def test_the_stop_string_that_completes_first_wins() -> None:
    s = TextStream(["bc", "abcd"])
    assert s.push(b"xabcd") == "xa"  # "bc" is complete before "abcd" is
    assert s.stopped
    s = TextStream(["cd", "bcd"])
    assert s.push(b"abcde") == "a"  # both end together: the longer one
    assert TextStream("zz").push(b"a zz") == "a "  # a single string is one stop string


@settings(max_examples=200, deadline=None, database=None)
@given(st.text(alphabet="ab日\n", max_size=24), st.lists(st.text(alphabet="ab日", min_size=1, max_size=3),
                                                          max_size=3),
       st.lists(st.integers(min_value=0, max_value=80), max_size=8))
def test_stop_strings_in_any_pieces(text: str, stops: list[str], cuts: list[int]) -> None:
    # the stop string whose end comes first (on a tie, the longer one)
    found = [(i + len(stop), i) for stop in stops if (i := text.find(stop)) >= 0]
    want = text[:min(found)[1]] if found else text
    s = TextStream(stops)
    out = "".join(feed(s, split(text.encode(), cuts))) + s.flush()
    assert out == want
    assert s.stopped == bool(found)


def test_adopting_what_a_first_run_emitted() -> None:
    first = TextStream(["XY"])
    pieces = [b"hello ", b"wor", b"ld X"]
    emitted = "".join(feed(first, pieces))
    assert emitted == "hello world "
    # a resumed stream replays the same pieces, then continues after `emitted`
    again = TextStream(["XY"])
    feed(again, pieces)
    assert again.adopt_emitted(emitted)
    assert again.push(b"Z!") == "XZ!"
    # a shorter emitted text is continued from where it ended
    short = TextStream(["XY"])
    feed(short, pieces)
    assert short.adopt_emitted("hello")
    assert short.push(b"Z") == " world XZ"
    # text that the pieces never produced is refused
    other = TextStream()
    feed(other, pieces)
    assert not other.adopt_emitted("goodbye")


def test_empty_stop_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        TextStream([""])
    with pytest.raises(TypeError):
        TextStream([b"bytes"])
