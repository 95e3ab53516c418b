"""Ranks sharing one device train the digits CNN over Gloo and over DLCP, and run
DLCP's collectives on that device's tensors; compares the results with Gloo's.

    python tests/cuda/gpu_check.py --device cuda --world-sizes 2 4 --json $OUT/gpu_check.json
    python tests/cuda/gpu_check.py --device cpu --world-sizes 2 --steps 2   # dry run

For each world size, three trainings of the same model from the same seed on
the same shards, DDP in every one: ``gloo`` (plain DDP over a Gloo group),
``hook`` (a Gloo group, gradients through DLCP's DDP hook, ``p = 0``) and
``pg`` (``init_process_group("dlcp")``, the default DDP reduction over it). It
reports rank 0's time per iteration (the first iteration left out), how far
the first step's gradients and the last parameters are from Gloo's, whether
every rank ends with the same parameters, and the host-staging cost (copying
one gradient's worth of the device's memory to pinned host memory and back,
as the shims stage CUDA tensors). ``collectives`` runs each of DLCP's process-group
operations once on the device's tensors and checks the values.

``--device cpu`` runs the same code on CPU tensors: the CPU tests run it so the
logic is known to work up to the CUDA calls. The exit status is 1 when a check
fails (the JSON says which), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

MODES = ("gloo", "hook", "pg")
#: largest relative difference from Gloo's first-step gradients taken as equal
#: (the sums run in another order: float32 rounding only)
GRAD_REL_TOL = 1e-4
#: largest difference from Gloo's parameters after the steps
PARAM_ABS_TOL = 1e-3
BATCH = 32
RESULT_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _train_digits() -> Any:
    """``examples/train_digits.py`` (a script, not a package), loaded by path."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"
    spec = importlib.util.spec_from_file_location("train_digits", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def digits(world: int, rank: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """This rank's training shard: scikit-learn's digits when it is installed,
    else seeded random 8x8 images with random labels (named in the result)."""
    shard = _train_digits().shard
    try:
        x, y, _, _ = _train_digits().load_data(0)
        source = "sklearn digits"
    except ImportError:
        g = torch.Generator().manual_seed(0)
        x = torch.rand(1437, 1, 8, 8, generator=g)
        y = torch.randint(0, 10, (1437,), generator=g)
        source = "synthetic (scikit-learn not installed)"
    idx = shard(len(x), rank, world, seed=0, epoch=0)
    return x[idx], y[idx], source


def staging_cost(numel: int, device: torch.device, repeats: int = 20) -> float:
    """Seconds to copy ``numel`` float32 from ``device`` to pinned host memory and
    back (the shims' staging of a CUDA tensor), the mean of ``repeats``."""
    src = torch.randn(numel, device=device)
    host = torch.empty(numel, pin_memory=device.type == "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        host.copy_(src)
        src.copy_(host, non_blocking=True)
        sync()
    return (time.perf_counter() - start) / repeats


def train(rank: int, world: int, mode: str, device: torch.device, steps: int) -> dict[str, Any]:
    from shims.ddp import DLCPState, dlcp_hook

    build_model = _train_digits().build_model

    torch.manual_seed(0)
    model = build_model().to(device)
    ddp = nn.parallel.DistributedDataParallel(model)
    state = None
    if mode == "hook":
        state = DLCPState(model=ddp, p=0.0)
        ddp.register_comm_hook(state, dlcp_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y, source = digits(world, rank)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times, first_grads = [], None
    for step in range(steps):
        lo = (step * BATCH) % (len(x) - BATCH)
        xb, yb = x[lo : lo + BATCH].to(device), y[lo : lo + BATCH].to(device)
        sync()
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(xb), yb).backward()
        if first_grads is None:
            # (numpy: a torch tensor would travel to the parent as shared memory
            # that its rank, once exited, no longer serves)
            first_grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).cpu().numpy()
        opt.step()
        sync()
        times.append(time.perf_counter() - start)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().numpy()
    # every rank's last bucket done before any closes its endpoint (as
    # examples/train_digits.py ends): a peer still finishing a send needs it open
    dist.barrier()
    if state is not None:
        state.close()
    numel = params.size
    return {
        "data": source,
        "iteration_s": times,
        "first_grads": first_grads,
        "params": params,
        "staging_s": staging_cost(numel, device) if mode != "gloo" else None,
        "gradient_bytes": numel * 4,
    }


def collectives(rank: int, world: int, device: torch.device) -> dict[str, bool]:
    """Each of the dlcp group's operations once on ``device``'s tensors: name -> right."""
    ok: dict[str, bool] = {}
    r = float(rank + 1)
    total = world * (world + 1) / 2

    def full(value: float, n: int = 1000, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.full((n,), value, dtype=dtype, device=device)

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        t = full(r, dtype=dtype)
        dist.all_reduce(t)
        # (values only: the reduction is in place, so ``t`` cannot change device,
        # and ``torch.device("cuda") != torch.device("cuda:0")`` would fail it anyway)
        ok[f"all_reduce_sum_{dtype}"] = bool((t == total).all())
    big = full(r, n=1 << 20)  # (the ring, not the one-round exchange)
    dist.all_reduce(big)
    ok["all_reduce_sum_4MiB"] = bool((big == total).all())
    m = full(r, dtype=torch.int64)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    ok["all_reduce_max_int64"] = bool((m == world).all())
    b = full(r)
    dist.broadcast(b, src=world - 1)
    ok["broadcast"] = bool((b == world).all())
    gathered = torch.empty(world * 1000, device=device)
    dist.all_gather_into_tensor(gathered, full(r))
    want = torch.arange(1, world + 1, device=device, dtype=torch.float32).repeat_interleave(1000)
    ok["all_gather_into_tensor"] = bool(torch.equal(gathered, want))
    outs = [torch.empty(1000, device=device) for _ in range(world)]
    dist.all_gather(outs, full(r))
    ok["all_gather"] = all(bool((o == q + 1).all()) for q, o in enumerate(outs))
    rs = torch.empty(1000, device=device)
    dist.reduce_scatter_tensor(rs, full(r, n=world * 1000))
    ok["reduce_scatter_tensor"] = bool((rs == total).all())
    a2a_in = torch.arange(world, device=device, dtype=torch.float32) + 10 * rank
    a2a_out = torch.empty(world, device=device)
    dist.all_to_all_single(a2a_out, a2a_in)
    a2a_want = torch.arange(world, device=device, dtype=torch.float32) * 10 + rank
    ok["all_to_all_single"] = bool(torch.equal(a2a_out, a2a_want))
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    got = torch.empty(1000, device=device)
    send = dist.isend(full(r), nxt)
    dist.recv(got, prv)
    send.wait()
    ok["send_recv"] = bool((got == prv + 1).all())
    work = dist.all_reduce(full(r), async_op=True)
    fut = work.get_future()
    fut.wait()
    ok["future_done"] = fut.done() and work.is_completed()
    dist.barrier()
    ok["barrier"] = True
    return ok


def rank_main(
    rank: int, world: int, port: int, what: str, device_name: str, steps: int, queue: Any
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
        WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
    )  # fmt: skip
    import dlcp  # noqa: F401  - registers the "dlcp" backend

    device = torch.device(device_name)
    torch.set_num_threads(1)
    # torch 2.13 deprecates all_gather_into_tensor's name (2.11 has no other)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message="Grad strides do not match")
    try:
        backend = "gloo" if what in ("gloo", "hook") else "dlcp"
        dist.init_process_group(backend, rank=rank, world_size=world)
        result: Any = (
            collectives(rank, world, device)
            if what == "collectives"
            else train(rank, world, what, device, steps)
        )
        dist.destroy_process_group()
        queue.put((rank, result, None))
    except Exception:
        queue.put((rank, None, traceback.format_exc()))


def launch(world: int, what: str, device: str, steps: int) -> list[Any]:
    """Run ``what`` in ``world`` spawned ranks; their results by rank. A rank that
    fails raises here with its traceback."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=rank_main, args=(r, world, port, what, device, steps, queue))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: list[Any] = [None] * world
    errors = []
    try:
        for _ in range(world):
            rank, result, error = queue.get(timeout=RESULT_TIMEOUT_S)
            results[rank] = result
            if error:
                errors.append(f"rank {rank}:\n{error}")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise RuntimeError(f"{what} at world size {world} failed:\n" + "\n".join(errors))
    return results


def compare(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per mode: rank 0's figures and the differences from Gloo's results."""
    base = runs["gloo"][0]
    out: dict[str, Any] = {}
    for mode, ranks in runs.items():
        r0 = ranks[0]
        times = r0["iteration_s"][1:] or r0["iteration_s"]
        grad_scale = float(np.abs(base["first_grads"]).max()) or 1.0
        spread = max(float(np.abs(r["params"] - r0["params"]).max()) for r in ranks)
        entry = {
            "data": r0["data"],
            "iteration_ms_median": 1e3 * sorted(times)[len(times) // 2],
            "iteration_ms_mean": 1e3 * sum(times) / len(times),
            "replicas_max_abs_diff": spread,
            "grad_rel_diff_vs_gloo": float(np.abs(r0["first_grads"] - base["first_grads"]).max())
            / grad_scale,
            "param_max_abs_diff_vs_gloo": float(np.abs(r0["params"] - base["params"]).max()),
            "gradient_bytes": r0["gradient_bytes"],
        }
        if r0["staging_s"] is not None:
            entry["staging_ms_per_gradient"] = 1e3 * r0["staging_s"]
        entry["ok"] = (
            entry["grad_rel_diff_vs_gloo"] <= GRAD_REL_TOL
            and entry["param_max_abs_diff_vs_gloo"] <= PARAM_ABS_TOL
            and spread == 0.0
        )
        out[mode] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (dry run)")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=30, help="training steps per run")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch.cuda.is_available() is False")
    if args.steps < 1 or min(args.world_sizes) < 2:
        parser.error("--steps must be >= 1 and every --world-sizes value >= 2")
    report: dict[str, Any] = {
        "command": " ".join([sys.executable, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
        "python": platform.python_version(),
        "device": args.device,
        "steps": args.steps,
        "tolerances": {"grad_rel": GRAD_REL_TOL, "param_abs": PARAM_ABS_TOL},
        "world_sizes": {},
    }
    ok = True
    for world in args.world_sizes:
        entry: dict[str, Any] = {}
        try:
            checks = launch(world, "collectives", args.device, args.steps)
            entry["collectives"] = {k: all(c[k] for c in checks) for k in checks[0]}
            runs = {mode: launch(world, mode, args.device, args.steps) for mode in MODES}
            entry["training"] = compare(runs)
            passed = all(entry["collectives"].values()) and all(
                m["ok"] for m in entry["training"].values()
            )
        except Exception as exc:
            entry["error"] = str(exc)
            passed = False
        entry["ok"] = passed
        ok = ok and passed
        report["world_sizes"][str(world)] = entry
        report["ok"] = ok
        print(json.dumps({world: entry}, indent=1), flush=True)
        if args.json:  # (after each world size: a run stopped later keeps these)
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
