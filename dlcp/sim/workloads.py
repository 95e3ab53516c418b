"""Training communication as a DAG of messages.

Every message (a *flow*) has a source and destination host, a size, a priority
class, a loss bound, a ``group`` it counts towards and the group it waits for
(``after``). A group completes when all its member flows have; the ns-3 side
then starts every flow waiting on it. Flow sizes are the real per-layer
gradient sizes (:mod:`dlcp.sim.models`) times ``SimConfig.scale``.

* ``ps-<model>``: ``servers`` hosts spread over the leaves are parameter
  servers, the others workers. Layers larger than ``partition_bytes`` are split
  into equal partitions (as BytePS does) and partitions are assigned to servers,
  largest first, to the least-loaded one. Each iteration: every worker pushes
  each partition to its server (bound ``p``); once a server has a partition
  from all workers it sends it back to every worker (bound ``p_pull``); a
  worker's next iteration starts when it has pulled everything.
* ``ring-<model>``: layers are packed back to front into buckets of at most
  ``bucket_bytes`` (PyTorch DDP) and each bucket is all-reduced around a ring of
  all hosts in order: ``N - 1`` reduce-scatter steps (bound ``p``) and ``N - 1``
  all-gather steps (bound ``p_pull``), each a message of ``bucket / N`` from a
  host to the next, started when the host received the previous step.

Priority: the layer at position ``i`` of ``L`` (front = 0) gets class
``7 - 8 i // L`` when front layers go first (the next forward pass needs them
first), ``8 i // L`` otherwise. Optional background: every host sends
``background_flows`` reliable messages of ``background_bytes`` to random other
hosts at the start, in class 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .config import SimConfig
from .models import Layer, load_layers

__all__ = ["Flow", "Workload", "build_workload"]


@dataclass(frozen=True, slots=True)
class Flow:
    src: int
    dst: int
    nbytes: int
    cls: int
    p: float
    after: int  # group id or -1
    group: int  # group id or -1
    kind: str  # push, pull, reduce-scatter, all-gather, background
    iteration: int


@dataclass(frozen=True)
class Workload:
    flows: list[Flow]
    workers: list[int]
    servers: list[int]
    gradient_bytes: int  # per worker, unscaled

    @property
    def n_groups(self) -> int:
        return 1 + max((max(f.after, f.group) for f in self.flows), default=-1)


class _Groups:
    def __init__(self) -> None:
        self._ids: dict[tuple[object, ...], int] = {}

    def __call__(self, *key: object) -> int:
        return self._ids.setdefault(key, len(self._ids))


def _cls(i: int, n: int, front_first: bool) -> int:
    c = min(7, 8 * i // max(1, n))
    return 7 - c if front_first else c


def _scaled(nbytes: float, scale: float) -> int:
    return max(1, round(nbytes * scale))


def spread_servers(hosts: int, hosts_per_leaf: int, servers: int) -> list[int]:
    """Server hosts taken round robin over the leaves (first slot of each leaf, ...)."""
    leaves = hosts // hosts_per_leaf
    order = [leaf * hosts_per_leaf + slot
             for slot in range(hosts_per_leaf) for leaf in range(leaves)]  # fmt: skip
    return sorted(order[:servers])


def _parameter_server(cfg: SimConfig, layers: list[Layer]) -> Workload:
    servers = spread_servers(cfg.hosts, cfg.hosts_per_leaf, cfg.servers)
    workers = [h for h in range(cfg.hosts) if h not in set(servers)]
    parts: list[tuple[int, int]] = []  # (layer index, unscaled bytes)
    for i, layer in enumerate(layers):
        n = -(-layer.grad_bytes // cfg.partition_bytes)
        q, r = divmod(layer.grad_bytes, n)
        parts += [(i, q + (1 if k < r else 0)) for k in range(n)]
    load = dict.fromkeys(servers, 0)
    owner: dict[int, int] = {}
    for j in sorted(range(len(parts)), key=lambda j: (-parts[j][1], j)):
        s = min(servers, key=lambda s: (load[s], s))
        owner[j] = s
        load[s] += parts[j][1]
    g = _Groups()
    flows: list[Flow] = []
    for it in range(cfg.iterations):
        for w in workers:
            after = g("pulled", it - 1, w) if it else -1
            for j, (li, nbytes) in enumerate(parts):
                flows.append(Flow(w, owner[j], _scaled(nbytes, cfg.scale),
                                  _cls(li, len(layers), cfg.front_layers_first), cfg.p,
                                  after, g("pushed", it, j), "push", it))  # fmt: skip
        for j, (li, nbytes) in enumerate(parts):
            for w in workers:
                flows.append(Flow(owner[j], w, _scaled(nbytes, cfg.scale),
                                  _cls(li, len(layers), cfg.front_layers_first), cfg.p_pull,
                                  g("pushed", it, j), g("pulled", it, w), "pull", it))  # fmt: skip
    return Workload(flows, workers, servers, sum(lay.grad_bytes for lay in layers))


def _ring(cfg: SimConfig, layers: list[Layer]) -> Workload:
    buckets: list[tuple[int, int]] = []  # (front-most layer index, bytes), back to front
    size, front = 0, len(layers) - 1
    for i in reversed(range(len(layers))):
        if size and size + layers[i].grad_bytes > cfg.bucket_bytes:
            buckets.append((front, size))
            size = 0
        size += layers[i].grad_bytes
        front = i
    buckets.append((front, size))
    n = cfg.hosts
    g = _Groups()
    flows: list[Flow] = []
    steps = 2 * (n - 1)
    for it in range(cfg.iterations):
        for b, (li, nbytes) in enumerate(buckets):
            chunk = _scaled(nbytes / n, cfg.scale)
            cls = _cls(li, len(layers), cfg.front_layers_first)
            for s in range(steps):
                reduce = s < n - 1
                for h in range(n):
                    # a step waits for the host's previous step (or previous iteration)
                    prev = g(it - 1, b, steps - 1, h) if it else -1
                    after = g(it, b, s - 1, h) if s else prev
                    kind = "reduce-scatter" if reduce else "all-gather"
                    flows.append(Flow(h, (h + 1) % n, chunk, cls, cfg.p if reduce else cfg.p_pull,
                                      after, g(it, b, s, (h + 1) % n), kind, it))  # fmt: skip
    return Workload(flows, list(range(n)), [], sum(lay.grad_bytes for lay in layers))


def build_workload(cfg: SimConfig) -> Workload:
    """The flows of ``cfg.workload`` (validated by SimConfig) on ``cfg.hosts`` hosts."""
    kind, model = cfg.workload.split("-", 1)
    layers = load_layers(model)
    wl = _parameter_server(cfg, layers) if kind == "ps" else _ring(cfg, layers)
    if cfg.background_flows:
        rng = random.Random(cfg.seed)
        for h in range(cfg.hosts):
            for _ in range(cfg.background_flows):
                dst = rng.choice([x for x in range(cfg.hosts) if x != h])
                wl.flows.append(
                    Flow(h, dst, cfg.background_bytes, 0, 0.0, -1, -1, "background", -1)
                )
    return wl
