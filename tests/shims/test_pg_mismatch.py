"""Cross-rank misuse of the ``"dlcp"`` backend is refused on every rank, in the
words of the program that made it, instead of giving silently wrong results or
timing out: tensors of other dtypes of one byte size, other reductions,
collectives issued in other orders, an empty tensor on some ranks only. Three
real ranks on loopback (``tests/shims/pg_worker_mismatch.py``, started as
``test_process_group.py`` starts its ranks)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from tests.shims.test_process_group import WORLD, outcome, run_ranks

pytestmark = pytest.mark.integration

#: the timeout of the worker's group: a refusal comes well before it
SHORT = 8.0


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(WORLD, tmp_path_factory.mktemp("mismatch"), "tests.shims.pg_worker_mismatch")


def refused(seen: dict[str, Any], *words: str) -> None:
    """A clear, prompt refusal naming ``words`` (not a timeout, not a result)."""
    assert seen["raised"] == "CollectiveMismatch", seen
    assert "Timed out" not in seen["message"], seen
    assert seen["seconds"] < SHORT / 2, seen
    for word in words:
        assert word in seen["message"], (word, seen)


def root_sent(seen: dict[str, Any]) -> None:
    """A rank that only sends (a broadcast's root) waits for no signature: its
    eager sends complete, or fail where a receiver refused (never a timeout)."""
    assert seen["raised"] in ("", "TransferFailed"), seen
    assert seen["seconds"] < SHORT / 2, seen


@pytest.mark.parametrize(
    ("op", "mine", "theirs"),
    [
        ("all_reduce", "int64[8]", "float64[8]"),
        ("broadcast", "int32[6]", "float32[6]"),
        ("all_gather", "int64[4]", "float64[4]"),
        ("all_to_all_single", "int32[2]", "float32[2]"),
    ],
)
def test_other_dtypes_of_one_byte_size_are_refused(
    ranks: list[dict[str, Any]], op: str, mine: str, theirs: str
) -> None:
    for rank, seen in enumerate(outcome(ranks, "other_dtypes_of_one_byte_size")):
        if op == "broadcast" and rank == 0:
            root_sent(seen[op])
        else:
            refused(seen[op], op, mine, theirs)


def test_other_reductions_are_refused(ranks: list[dict[str, Any]]) -> None:
    for seen in outcome(ranks, "other_reductions"):
        refused(seen, "all_reduce", "MAX", "SUM")


def test_collectives_in_other_orders_are_refused(ranks: list[dict[str, Any]]) -> None:
    for seen in outcome(ranks, "collectives_in_other_orders"):
        for op in ("all_reduce", "all_gather"):
            refused(seen[op], "all_reduce", "all_gather", "same order")


def test_a_float_all_reduce_beside_a_broadcast_is_refused(ranks: list[dict[str, Any]]) -> None:
    seen = outcome(ranks, "a_float_all_reduce_beside_a_broadcast")
    root_sent(seen[0])
    for got in seen[1:]:
        refused(got, "all_reduce", "broadcast")


def test_an_empty_tensor_on_every_rank_completes(ranks: list[dict[str, Any]]) -> None:
    for seen in outcome(ranks, "an_empty_tensor_on_every_rank_completes"):
        for case, got in seen.items():
            assert got["raised"] == "", (case, got)


@pytest.mark.parametrize(
    ("case", "empty", "full"),
    [
        ("all_reduce_max_int64", "int64[0]", "int64[8]"),
        ("all_reduce_sum", "float32[0]", "float32[8]"),
        ("all_reduce_sum_ring", "float32[0]", "float32[1600000]"),
        ("broadcast", "float32[0]", "float32[8]"),
    ],
)
def test_an_empty_tensor_on_one_rank_is_refused_not_timed_out(
    ranks: list[dict[str, Any]], case: str, empty: str, full: str
) -> None:
    for rank, seen in enumerate(outcome(ranks, "an_empty_tensor_on_one_rank_is_refused")):
        if case == "broadcast" and rank == 0:
            root_sent(seen[case])
        else:
            refused(seen[case], empty, full)


def test_the_check_is_asked_for_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from shims.pg_signature import checking

    monkeypatch.delenv("DLCP_CHECK_COLLECTIVES", raising=False)
    assert not checking()  # (off by default: a message per peer and call)
    monkeypatch.setenv("DLCP_CHECK_COLLECTIVES", "1")
    assert checking()
    monkeypatch.setenv("DLCP_CHECK_COLLECTIVES", "yes")
    with pytest.raises(ValueError, match=r"DLCP_CHECK_COLLECTIVES='yes': expected 1"):
        checking()
