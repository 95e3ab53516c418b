"""Point-to-point, all-to-all and sparse all-reduce over the ``"dlcp"`` backend,
and the state of its works: three real ranks on loopback
(``tests/shims/pg_worker_p2p.py``, started as ``test_process_group.py``
starts its ranks), every result compared with the same operation over Gloo."""

from __future__ import annotations

import re
from typing import Any

import pytest

pytest.importorskip("torch")

from tests.shims.test_process_group import WORLD, outcome, run_ranks

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(WORLD, tmp_path_factory.mktemp("p2p"), "tests.shims.pg_worker_p2p")


@pytest.mark.parametrize("name", [
    "send_recv_match_gloo",
    "tags_are_matched_independently_and_in_order",
    "isend_irecv_and_their_work",
    "batch_isend_irecv_matches_gloo",
    "large_messages_and_subgroups",
    "all_to_all_single_matches_gloo",
    "all_to_all_matches_gloo",
    "all_to_all_with_a_size_per_pair",
    "sparse_all_reduce_matches_gloo",
    "ddp_with_sparse_embeddings_matches_gloo",
    "work_state_agrees_at_every_moment",
])
def test_matches_gloo_or_expectation(ranks: list[dict[str, Any]], name: str) -> None:
    outcome(ranks, name)


def test_recv_from_any_source_reports_the_source(ranks: list[dict[str, Any]]) -> None:
    got = outcome(ranks, "recv_from_any_source_reports_the_source")
    assert got[0] == {str(r): 2 for r in range(1, WORLD)}, got


def test_a_subgroup_reports_the_global_source_rank(ranks: list[dict[str, Any]]) -> None:
    assert outcome(ranks, "large_messages_and_subgroups")[0] == {"source": 2}


def test_point_to_point_misuse_names_what_was_wrong(ranks: list[dict[str, Any]]) -> None:
    for rank, seen in enumerate(outcome(ranks, "point_to_point_misuse_is_refused")):
        assert seen["self"] == f"recv: rank {rank} names itself as the peer", seen
        assert "tag=1073741824 outside" in seen["tag"], seen
        assert f"peer rank {WORLD + 3} outside 0..{WORLD - 1}" in seen["peer"], seen


def test_a_sparse_all_reduce_of_other_sizes_names_them(ranks: list[dict[str, Any]]) -> None:
    for rank, msg in enumerate(outcome(ranks, "sparse_all_reduce_of_other_sizes_is_refused")):
        theirs = "size [20, 3]" if rank == 0 else "size [21, 3]"
        assert "allreduce (sparse): rank" in msg and theirs in msg, msg
        assert "torch.float32" in msg and "1 sparse dimensions" in msg, msg


def test_all_to_all_misuse_names_the_splits(ranks: list[dict[str, Any]]) -> None:
    for msg in outcome(ranks, "all_to_all_misuse_is_refused_and_keeps_ranks_paired"):
        assert "output_split_sizes=[5, 5, 5]" in msg and "the 3 rows of output" in msg, msg


#: what torch's own tests match in a backend's timeout error
TORCH_TIMEOUT = re.compile(" (Timed out|closed|timeout) ")


def test_timeouts_say_timed_out_name_the_operation_peers_and_timeout(
    ranks: list[dict[str, Any]],
) -> None:
    seen = outcome(ranks, "timeouts_say_timed_out_and_name_peers")[0]
    head = "Timed out: dlcp {} on rank 0 reached its timeout of 2 s: "
    assert seen["all_reduce"].startswith(head.format("allreduce")), seen
    assert "did not arrive" in seen["all_reduce"], seen  # (the first peer it waited for)
    recv = head.format("recv from rank 1 (tag 5)") + "rank 1 did not arrive"
    assert seen["recv"].startswith(recv), seen
    assert seen["wait"].startswith("Timed out: dlcp recv from rank 2 (tag 4242)"), seen
    assert "0.3 s" in seen["wait"], seen
    for text in (seen["all_reduce"], seen["recv"], seen["wait"]):
        assert TORCH_TIMEOUT.search(text), text


def test_barrier_names_every_rank_that_did_not_arrive(ranks: list[dict[str, Any]]) -> None:
    seen = outcome(ranks, "timeouts_say_timed_out_and_name_peers")[0]
    assert seen["barrier"].startswith(
        "Timed out: dlcp barrier on rank 0 reached its timeout of 2 s: ranks 1, 2 did not arrive"
    ), seen
    assert TORCH_TIMEOUT.search(seen["barrier"]), seen
    assert seen["barrier_type"].endswith(",True"), seen  # a TimeoutError and a RuntimeError


def test_monitored_barrier_names_the_absent_rank_as_gloo_does(
    ranks: list[dict[str, Any]],
) -> None:
    got = outcome(ranks, "monitored_barrier_names_the_ranks_that_did_not_arrive")
    head = "Timed out: dlcp monitored_barrier on rank {} reached its timeout of 1 s: "
    assert got[0]["error"].startswith(head.format(0) + "rank 2 did not arrive"), got
    assert "[Rank 0]: Rank 2 failed to pass monitoredBarrier in 1000 ms" in got[0]["error"], got
    assert got[1]["error"].startswith(head.format(1) + "rank 0 did not arrive"), got
    assert got[2] == {}, got
