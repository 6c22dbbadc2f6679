"""Box ids: every id a box makes carries its box id where one regular expression finds it;
ids made without one stay as they were and still read."""
from __future__ import annotations

import re

import msgspec
import pytest

from lmsp import config, ids
from lmsp.store import Store


@pytest.fixture
def boxed():
    ids.set_box("b7")
    yield
    ids.set_box("")


def test_an_id_carries_the_box_between_its_prefix_and_its_time(boxed):
    made = ids.new_id("resp")
    assert re.fullmatch(r"resp_b7_[0-9A-Z]{26}", made)
    assert ids.owner(made) == "b7"
    assert ids.owner(made + "_2") == "b7"  # derived item ids keep it


def test_an_id_without_a_box_has_no_owner():
    made = ids.new_id("resp")
    assert re.fullmatch(r"resp_[0-9A-Z]{26}", made)
    assert ids.owner(made) is None
    assert ids.owner("msg_" + made[5:] + "_1") is None


def test_ids_of_one_box_keep_their_order_after_the_old_ones():
    old = ids.new_id("resp")
    ids.set_box("0")
    try:
        new = ids.new_id("resp")
    finally:
        ids.set_box("")
    assert old < new
    assert ids.time_part(old) < ids.time_part(new)


@pytest.mark.parametrize("bad", ["B1", "toolongid", "a-b", "a_b", " "])
def test_a_box_id_is_lowercase_letters_and_digits(bad):
    with pytest.raises(ValueError):
        ids.set_box(bad)
    with pytest.raises(ValueError):
        config.load(env={}, box_id=bad)


def test_peers_are_checked():
    cfg = config.load(env={"LMSP_BOX_ID": "a", "LMSP_PEERS": "b=127.0.0.1:81,c=h.lan:82"})
    assert config.parse_peers(cfg.peers) == {"b": "127.0.0.1:81", "c": "h.lan:82"}
    for bad in ("b=nohost", "B=h:1", "b=h:1,b=h:2", "a=h:1"):
        with pytest.raises(ValueError):
            config.load(env={"LMSP_BOX_ID": "a", "LMSP_PEERS": bad})
    with pytest.raises(ValueError, match="box_id"):
        config.load(env={"LMSP_PEERS": "b=h:1"})


def test_a_store_on_a_box_makes_every_id_with_the_box(tmp_path, boxed):
    store = Store.open(tmp_path / "lmsp.db")
    try:
        conv = store.create_conversation(metadata={}, items=[], client_id=None)
        client = store.create_client(name="c", scopes=["responses:read"], token_hash="x" * 64)
    finally:
        store.close()
    assert ids.owner(conv["id"]) == "b7"
    assert ids.owner(client["id"]) == "b7"


def test_the_wire_takes_ids_of_both_forms():
    from lmsp.wire.answers import ResponseId

    for value in ("resp_01JABCDEFGHJKMNPQRSTVWXYZ0", "resp_b1_01JABCDEFGHJKMNPQRSTVWXYZ0"):
        assert msgspec.convert(value, ResponseId) == value
