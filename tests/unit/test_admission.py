"""Admission: prices before tokenizing, refusals by deadline at a fixed rate, the priority policy."""

from __future__ import annotations

import pytest

from model_registry.errors import Overloaded
from model_registry.runtime.admission import Backlog, client_priority, price
from model_registry.types import ClassifyItem, EmbedItem, Media, Modality, PairItem, Text, TokenIds


def test_price_counts_characters_and_inputs_before_any_tokenizer() -> None:
    thirty = EmbedItem(Text("a" * 30))
    assert price([thirty], None) == 12  # ceil(30 / 3) + 2 special tokens
    assert price([thirty], 8) == 8  # truncated to the model's length
    assert price([EmbedItem(Text("a" * 30), truncate=False)], 8) == 12
    assert price([EmbedItem(TokenIds((1, 2, 3, 4, 5)))], None) == 5
    assert price([PairItem("abc", "defghi")], None) == 5
    assert price([ClassifyItem("abc", pair="defghi")], None) == 5  # a classified pair counts both texts
    assert price([ClassifyItem("abc")], None) == 3
    image = EmbedItem(Media(Modality.IMAGE, b"..."))
    assert price([image], 50) == 50
    assert price([image], None) == 256
    assert price([thirty] * 10, None) == 120


def test_a_request_is_admitted_only_while_its_deadline_can_be_met_at_the_measured_rate() -> None:
    backlog = Backlog(lambda: 100.0, headroom=1.0)
    first = backlog.admit(600, 0, seconds_left=10)
    backlog.admit(300, 0, seconds_left=10)
    with pytest.raises(Overloaded) as refused:
        backlog.admit(200, 0, seconds_left=10)  # 600 + 300 + 200 units at 100/s need 11 s
    assert refused.value.retry_after == 1.0
    with pytest.raises(Overloaded) as refused:
        backlog.admit(500, 0, seconds_left=10)
    assert refused.value.retry_after == 4.0
    assert backlog.cost == 900
    backlog.admit(500, 1, seconds_left=10)  # a higher class is not behind the bulk work
    first.release()
    first.release()  # idempotent
    backlog.admit(200, 0, seconds_left=10)
    assert backlog.cost == 1000


def test_headroom_keeps_part_of_the_deadline_free() -> None:
    backlog = Backlog(lambda: 100.0, headroom=0.5)
    backlog.admit(400, 0, seconds_left=10)
    with pytest.raises(Overloaded):
        backlog.admit(200, 0, seconds_left=10)  # 600 > 100/s x 10 s x 0.5


def test_a_reservation_is_repriced_to_what_the_prepared_items_cost() -> None:
    backlog = Backlog(lambda: 100.0, headroom=1.0)
    reservation = backlog.admit(900, 0, seconds_left=10)
    reservation.reprice(100)
    backlog.admit(800, 0, seconds_left=10)
    reservation.release()
    assert backlog.cost == 800


def test_until_measured_a_few_batches_are_admitted_at_a_time() -> None:
    backlog = Backlog(lambda: 0.0, probe=100)
    backlog.admit(80, 0, seconds_left=1)
    with pytest.raises(Overloaded):
        backlog.admit(30, 0, seconds_left=1)
    lone = Backlog(lambda: 0.0, probe=100)
    lone.admit(500, 0, seconds_left=1)  # alone, it is what measures the rate


def test_clients_may_lower_their_priority_but_raise_it_only_when_allowed() -> None:
    assert client_priority(None, may_raise=False) is None
    assert client_priority(-5, may_raise=False) == -5
    assert client_priority(0, may_raise=False) == 0
    assert client_priority(100, may_raise=False) is None  # the server's default for its size
    assert client_priority(1, may_raise=False) is None
    assert client_priority(100, may_raise=True) == 100
