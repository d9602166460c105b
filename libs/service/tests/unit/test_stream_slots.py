"""`StreamSlots`: a client's share and the process's total, each slot given back exactly once."""

from __future__ import annotations

import pytest

from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.service import ANONYMOUS, StreamLimitError, StreamSlots, client_key


def test_a_client_beyond_its_share_is_refused_and_others_are_not() -> None:
    slots = StreamSlots(per_client=2, total=10)
    held = [slots.claim("ada"), slots.claim("ada")]
    with pytest.raises(StreamLimitError) as refused:
        slots.claim("ada")
    assert (refused.value.scope, refused.value.limit) == ("client", 2)
    assert "this client already follows 2 run streams" in str(refused.value)
    bob = slots.claim("bob")
    assert (slots.in_use("ada"), slots.in_use("bob"), slots.in_use()) == (2, 1, 3)
    held[0].release()
    slots.claim("ada")  # a released slot is there again
    bob.release()
    assert slots.in_use() == 2


def test_the_total_caps_every_client_together() -> None:
    slots = StreamSlots(per_client=5, total=3)
    for client in ("a", "b", "c"):
        slots.claim(client)
    with pytest.raises(StreamLimitError) as refused:
        slots.claim("d")
    assert (refused.value.scope, refused.value.limit) == ("total", 3)


def test_a_slot_is_given_back_once_however_often_it_is_released() -> None:
    slots = StreamSlots(per_client=3, total=3)
    with slots.claim("ada") as slot:
        slot.release()
        slot.release()
    slot.release()
    assert slots.in_use() == 0
    assert slots.in_use("ada") == 0


def test_clients_that_left_leave_no_entry_behind() -> None:
    slots = StreamSlots(per_client=1, total=100_000)
    for n in range(10_000):
        slots.claim(f"client-{n}").release()
    assert slots._by_client == {}


def test_limits_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        StreamSlots(per_client=0, total=1)


def test_users_count_as_themselves_and_anonymous_callers_by_address() -> None:
    assert client_key(Principal(user_id="ada"), "10.0.0.1") == client_key(Principal(user_id="ada"), "10.0.0.2")
    assert client_key(ANONYMOUS, "10.0.0.1") == "anonymous@10.0.0.1"
    assert client_key(ANONYMOUS, "10.0.0.1") != client_key(ANONYMOUS, "10.0.0.2")
    # A user literally named "anonymous" does not share anonymous callers' address shares.
    assert client_key(Principal(user_id="anonymous"), "10.0.0.1") == "anonymous@10.0.0.1"
    assert client_key(ANONYMOUS, "") == "anonymous@unknown"
