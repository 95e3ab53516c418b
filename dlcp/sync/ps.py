"""Parameter server with bulk-synchronous (BSP), asynchronous (ASP) and
stale-synchronous (SSP) consistency, on DLCP.

Servers hold the parameters, sharded by whole parameter tensors; a server is a
*dedicated* rank (it trains nothing: it calls :meth:`ParameterServerSync.serve`)
or *co-located* with a worker (it serves from a thread beside the training
loop). Each worker's ``step()`` runs its optimizer, pushes the change it made
(the update: bounded loss ``p``, lost elements zero-filled, i.e. those elements
of that update are skipped) to the servers, then reads the parameters back
(bound ``p_pull``, 0 by default: exact) for its next iteration. The servers add
every update divided by the number of workers, so that one update from every
worker moves the parameters as one step on the averaged update would.

What a read may see is :mod:`dlcp.sync.clocks`' rules: BSP applies each clock's
updates together and reads wait for them; SSP reads at clock ``c`` wait until
every worker's updates up to ``c - s - 1`` and the reader's own are in; ASP
reads never wait. Every step reports the clocks and version it read, its
staleness (``c`` minus the slowest clock read), and what the transport lost:
this worker's pushes (as the servers saw them) and its pulls.

Every rank of the world is a server, a worker or both; each constructs the
scheme with the same model (same initial values: the servers start from their
own copy) and the same settings.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ..errors import ConfigError, UsageStateError
from ..io.endpoint import Endpoint
from ..proto.config import FillPolicy
from ..proto.loss_report import N_CLASSES
from .api import StepReport, SyncScheme, WorkerFailed, check_loss_bound, check_world, sync_msg
from .psserver import (
    DATA,
    FAILED,
    FINISH,
    META,
    PUSH,
    READ,
    REQUEST,
    ParameterServer,
    ReadReply,
    UpdateRule,
    decode_meta,
    encode_request,
)

__all__ = ["ParameterServerSync", "check_ps_roles"]

MODES = ("bsp", "asp", "ssp")


def check_ps_roles(
    world_size: int, servers: Sequence[int] | None, workers: Sequence[int] | None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Server and worker ranks (None: every rank), checked before any traffic."""
    everyone = list(range(world_size))
    srv = list(servers) if servers is not None else everyone
    if workers is not None:
        wrk = list(workers)
    else:  # every rank when the servers are co-located everywhere; else the non-servers
        wrk = everyone if servers is None else [r for r in everyone if r not in srv]
    for name, ranks in (("servers", srv), ("workers", wrk)):
        if not ranks or len(set(ranks)) != len(ranks):
            raise ConfigError(f"{name}={ranks} must be distinct ranks, at least one")
        outside = [r for r in ranks if not 0 <= r < world_size]
        if outside:
            raise ConfigError(f"{name}: rank(s) {outside} outside the world 0..{world_size - 1}")
    idle = set(everyone) - set(srv) - set(wrk)
    if idle:
        raise ConfigError(f"rank(s) {sorted(idle)} are neither server nor worker")
    return tuple(srv), tuple(wrk)


class ParameterServerSync(SyncScheme):
    """One rank of a BSP / ASP / SSP parameter-server job (module docstring)."""

    #: update ``c`` is computed on the read at clock ``c - lag`` (see ParameterServer)
    lag = 0

    def update_rule(self, n_workers: int) -> UpdateRule | None:
        """How the servers scale updates (None: by 1 / workers)."""
        return None

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        endpoint: Endpoint,
        world_size: int,
        mode: str = "ssp",
        staleness: int = 0,
        servers: Sequence[int] | None = None,
        workers: Sequence[int] | None = None,
        p: float = 0.0,
        p_pull: float = 0.0,
        fill: str | FillPolicy = FillPolicy.ZERO,
        name: str | None = None,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"mode={mode!r}: one of {', '.join(MODES)}")
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise ConfigError(f"staleness s={staleness!r} must be an integer >= 0")
        check_world(endpoint.rank, world_size)
        check_loss_bound("p", p)
        check_loss_bound("p_pull", p_pull)
        fill_policy = FillPolicy(fill) if isinstance(fill, str) else fill
        if fill_policy is FillPolicy.PREVIOUS:
            raise ConfigError("fill='previous' has no previous update to keep: 'zero' or 'rescale'")
        self.servers, self.workers = check_ps_roles(world_size, servers, workers)
        super().__init__(model, optimizer)
        self.name = name or mode
        self.mode = mode
        self.staleness = staleness if mode == "ssp" else 0
        self.endpoint = endpoint
        self.rank = endpoint.rank
        self.p, self.p_pull = p, p_pull
        self.shards = self.flat.shard_by_parameter(len(self.servers))
        self.server: ParameterServer | None = None
        self._requests = 0
        self._pushes: list[Future[Any]] = []
        start = self.flat.read()
        if self.rank in self.servers:
            i = self.servers.index(self.rank)
            self.server = ParameterServer(
                endpoint,
                self.flat.gather(start, self.shards[i]),
                workers=self.workers,
                staleness=None if mode == "asp" else self.staleness,
                bsp=mode == "bsp",
                p_push=p,
                p_pull=p_pull,
                fill=fill_policy,
                rule=self.update_rule(len(self.workers)),
                lag=self.lag,
            )
            self.server.start()
        self._pulled = [self.flat.gather(start, s) for s in self.shards]
        self.last_read: ReadReply | None = None
        #: why this job cannot go on, once a read has said so
        self.failure: BaseException | None = None
        if self.is_worker:
            self._read(0)  # the servers' parameters are everyone's common start

    @property
    def is_worker(self) -> bool:
        return self.rank in self.workers

    # ----------------------------------------------------------------- training loop

    def step(self) -> StepReport:
        if not self.is_worker:
            raise ConfigError(f"rank {self.rank} is a dedicated server: it calls serve()")
        if self._closed:
            raise UsageStateError(f"rank {self.rank}: step() after close()")
        update = self.local_update()
        t0 = time.perf_counter()
        self._push(update)
        report = self._read(self.clock, t0)
        self.reports.append(report)
        return report

    def _push(self, update: npt.NDArray[np.float32]) -> list[Future[Any]]:
        """Push update ``clock`` to every server, without waiting; advance the clock.
        The futures of the remote pushes."""
        self._check_pushes()
        sent = []
        for i, server in enumerate(self.servers):
            part = self.flat.gather(update, self.shards[i])
            if server == self.rank:
                assert self.server is not None
                self.server.local_push(self.clock, part)
            else:
                sent.append(self.endpoint.send(
                    part, to=server, step=self.clock, msg=sync_msg(PUSH), p=self.p))  # fmt: skip
        self._pushes.extend(sent)
        self.clock += 1
        return sent

    def serve(self, timeout: float | None = None) -> None:
        """A dedicated server's whole job: serve until every worker has finished."""
        if self.server is None:
            raise ConfigError(f"rank {self.rank} serves no shard")
        self.server.join(timeout)
        self._closed = True
        if self.server.failure is not None:
            raise self.server.failure

    def close(self) -> None:
        """Tell the servers this worker has finished; a co-located server keeps serving
        the others until they have too (this waits for that)."""
        if self._closed:
            return
        self._closed = True
        if self.failure is not None:  # the servers know; nothing more to say
            if self.server is not None:  # it tells the other workers, then ends
                with contextlib.suppress(BaseException):
                    self.server.join(self.endpoint.config.timeout * 2)
            return
        try:
            if self.is_worker:
                self._request(FINISH, self.clock)
                for fut in self._pushes:
                    self._wait(fut)
        finally:
            if self.server is not None:
                # (as long as the others keep training; a silent one times out there)
                self.server.join(idle=self.endpoint.config.timeout * 2)

    # ----------------------------------------------------------------- plumbing

    def _wait(self, fut: Future[Any]) -> Any:
        return fut.result(timeout=self.endpoint.config.timeout + 5.0)

    def _check_pushes(self) -> None:
        """Drop pushes that have arrived; raise for one that failed."""
        keep = []
        for fut in self._pushes:
            if not fut.done():
                keep.append(fut)
            elif (exc := fut.exception()) is not None:
                raise exc
        self._pushes = keep

    def _request(
        self, op: int, clock: int
    ) -> list[tuple[Future[Any] | None, Future[Any] | None, Future[Any] | None]]:
        """Send request ``op`` at ``clock`` to every server; for a read, the futures of
        each server's reply (meta, data) or the local server's one future."""
        seq = self._requests
        self._requests += 1
        out: list[tuple[Future[Any] | None, Future[Any] | None, Future[Any] | None]] = []
        body = encode_request(op, clock)
        for i, server in enumerate(self.servers):
            if server == self.rank:
                assert self.server is not None
                local = self.server.local_request(seq, op, clock, 0)
                out.append((None, None, local if op == READ else None))
                continue
            meta = data = None
            if op == READ:  # posted before asking: the reply finds them waiting
                meta = self.endpoint.recv(src=server, step=seq, msg=sync_msg(META), p=0.0)
                data = self.endpoint.recv(src=server, step=seq, msg=sync_msg(DATA),
                                          out=self._pulled[i], p=self.p_pull,
                                          fill=FillPolicy.PREVIOUS if self.p_pull > 0
                                          else FillPolicy.ZERO)  # fmt: skip
            sent = self.endpoint.send(body, to=server, step=seq, msg=sync_msg(REQUEST), p=0.0)
            if op == FINISH:
                self._pushes.append(sent)
            out.append((meta, data, None))
        return out

    def _read(self, clock: int, t0: float | None = None) -> StepReport:
        t0 = time.perf_counter() if t0 is None else t0
        return self._collect(self._request(READ, clock), clock, t0)

    def _collect(
        self,
        replies: list[tuple[Future[Any] | None, Future[Any] | None, Future[Any] | None]],
        clock: int,
        t0: float,
    ) -> StepReport:
        """Wait for a read's replies, install the parameters, report."""
        lost = bounded = 0
        lost_chunks = [0] * N_CLASSES
        class_chunks = [0] * N_CLASSES
        clocks: list[int] | None = None
        version = 0
        slowest: int | None = None  # the slowest worker still training, as read
        try:
            for i, (meta_f, data_f, local_f) in enumerate(replies):
                if local_f is not None:
                    reply, shard = self._wait(local_f)
                    self._pulled[i][:] = shard
                else:
                    assert meta_f is not None and data_f is not None
                    got_meta = self._wait(meta_f)
                    reply = decode_meta(got_meta.data)
                    if reply.status == FAILED:
                        raise self._failed(reply)
                    got = self._wait(data_f)
                    r = got.report
                    lost += r.lost_elems
                    if self.p_pull > 0:
                        bounded += r.msg_elems
                    for k in range(N_CLASSES):
                        lost_chunks[k] += r.lost_chunks[k]
                        class_chunks[k] += r.lost_chunks[k] + r.received_chunks[k]
                if reply.status == FAILED:
                    raise self._failed(reply)
                lost += reply.lost_elems
                bounded += reply.bounded_elems
                for k in range(N_CLASSES):
                    lost_chunks[k] += reply.lost_chunks[k]
                    class_chunks[k] += reply.class_chunks[k]
                # shards are read one after another: per worker, the oldest clock read
                clocks = list(reply.clocks) if clocks is None else [
                    min(a, b) for a, b in zip(clocks, reply.clocks, strict=True)]  # fmt: skip
                version += reply.version
                if reply.slowest >= 0:
                    slowest = reply.slowest if slowest is None else min(slowest, reply.slowest)
                self.last_read = reply
        except BaseException as exc:
            self.failure = exc
            for meta_f, data_f, _ in replies:
                for f in (meta_f, data_f):
                    if f is not None:
                        f.cancel()
            raise
        flat = self.flat.read()
        for i, params in enumerate(self.shards):
            self.flat.scatter(flat, params, self._pulled[i])
        self.flat.write(flat)
        assert clocks is not None
        return StepReport(
            scheme=self.name,
            clock=clock,
            version=version,
            clocks=tuple(clocks),
            staleness=max(0, clock - slowest) if slowest is not None else 0,
            lost_elems=lost,
            bounded_elems=bounded,
            lost_chunks=tuple(lost_chunks),
            class_chunks=tuple(class_chunks),
            wait_seconds=time.perf_counter() - t0,
        )

    def _failed(self, reply: ReadReply) -> WorkerFailed:
        return WorkerFailed(
            f"rank {self.rank}: worker rank {reply.failed_rank} failed (the parameter server "
            "said so); this job cannot go on",
            reply.failed_rank,
        )

