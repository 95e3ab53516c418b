"""One rank of the TCP parameter-server hook test: ``python -m tests.training.tcp_ps_worker``.

Started by :func:`dlcp.launch.launch` with two ranks over Gloo. Rank 1 serves.
Rank 0 calls the hook with a bucket and records whether the future it got back
was already done; only then does it let rank 1 (through the store) call its own
hook, so rank 0's exchange cannot have ended when its hook returned. Both
futures must then give the average of the two buckets. A second bucket of 1.2 MB
moves in pieces (four of the default ``piece_bytes``, four sends a rank): its
average must be the one of the whole buckets, bit for bit. A closed state must refuse a later
bucket. Prints ``RESULT {json}``; any failure exits non-zero.
"""

from __future__ import annotations

import json
from datetime import timedelta

import torch
import torch.distributed as dist

from dlcp.errors import UsageStateError
from shims.tcp_ps import TcpPsState, tcp_ps_hook


class _Bucket:
    """What tcp_ps_hook reads of a torch.distributed.GradBucket."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor

    def buffer(self) -> torch.Tensor:
        return self._tensor


def main() -> int:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    state = TcpPsState(server=1)
    grad = torch.full((50_000,), float(rank + 1))
    if rank == 0:
        fut = tcp_ps_hook(state, _Bucket(grad))  # type: ignore[arg-type]
        done_at_return = fut.done()
        store.set("hook-returned", "1")
    else:
        store.wait(["hook-returned"])
        fut = tcp_ps_hook(state, _Bucket(grad))  # type: ignore[arg-type]
        done_at_return = None
    out = fut.wait()
    # a bucket in pieces: the server's sum in rank order, piece by piece; the
    # sends counted (rank 0 pushes 4 pieces, rank 1 serves 4 back)
    big = [torch.randn(300_000, generator=torch.Generator().manual_seed(r)) for r in (0, 1)]
    want = (torch.zeros(300_000) + big[0] + big[1]).div_(2)
    isend, sends = dist.isend, []

    def counted(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
        sends.append(tensor.numel())
        return isend(tensor, *args, **kwargs)  # type: ignore[arg-type]

    dist.isend = counted  # type: ignore[assignment]
    try:
        got = tcp_ps_hook(state, _Bucket(big[rank].clone())).wait()  # type: ignore[arg-type]
    finally:
        dist.isend = isend
    pieces_ok = bool(torch.equal(got, want)) and sends == [75_000] * 4
    state.close()
    try:
        tcp_ps_hook(state, _Bucket(grad))  # type: ignore[arg-type]
        refused = False
    except UsageStateError:
        refused = True
    result = {
        "rank": rank,
        "done_at_return": done_at_return,
        "mean_ok": bool(torch.equal(out, torch.full((50_000,), 1.5))),
        "same_buffer": out.data_ptr() == grad.data_ptr(),
        "pieces_ok": pieces_ok,
        "refused_after_close": refused,
    }
    print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
