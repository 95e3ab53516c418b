"""Authentication micro-benchmark: sealing and verifying data datagrams, GB/s.

    python -m dlcp.bench.auth --json        # or: dlcp bench auth --json

Datagrams of ``--datagram-bytes`` (default 1,456: a 32-byte header, 1,400 bytes of
payload and the 24-byte trailer of spec §3) lie back to back in a record buffer
of ``--size-mib`` (default 16), as the packetizer builds them. Each repetition
times, side by side in one process and one after the other:

* ``memcpy``: one numpy copy of the whole buffer into another (the baseline);
* ``seal_c_modes`` / ``verify_c_modes`` and ``seal_c_evp`` / ``verify_c_evp``:
  ``dlcp.proto.auth.seal_records`` / ``verify_records`` with the C batch functions
  (libcrypto's AES-GMAC), one call per batch of ``--batch-packets`` records
  (default: the protocol's), as the senders seal and the receive path verifies,
  with each of the C code's two ways to the tag (``dlcp/proto/gmac.h``: libcrypto's
  GCM mode functions, EVP's AES-GCM); ``seal_c`` / ``verify_c``: the same with the
  way the engines take with this libcrypto on this CPU (``gmac_backend``), timed
  through that choice, so that its cost shows too;
* ``seal_py`` / ``verify_py``: the same calls on the Python reference
  (``cryptography``'s AESGCM, one call per datagram), on a tenth of the buffer;
* ``blake2b``: keyed BLAKE2b-128 per datagram (``hashlib``), the tag DLCP used
  before AES-GMAC, on a tenth of the buffer.

GB/s count every byte of the datagrams (trailer included), medians over the
repetitions; ``*_ratio`` is that GB/s over memcpy's of the same repetition. Each
repetition runs the cases in turn from a different first one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from dlcp.proto import auth
from dlcp.proto.auth import NonceCounter
from dlcp.proto.config import ProtocolConfig

from .machine import cpu_times, describe

KEY = bytes(range(32))


def _on(backend: str, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` with the C code's keys computing tags the ``backend`` way."""

    def run() -> object:
        previous = auth.use_gmac_backend(backend)
        try:
            return fn()
        finally:
            auth.use_gmac_backend(previous)

    return run


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None, prog: str = "python -m dlcp.bench.auth") -> int:
    ap = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--size-mib", type=int, default=16, help="record buffer, MiB (default 16)")
    ap.add_argument("--datagram-bytes", type=int, default=1456,
                    help="bytes of one datagram, header and trailer included (default 1456)")
    ap.add_argument("--batch-packets", type=int, default=ProtocolConfig().batch_packets,
                    help="datagrams per C call (default: the protocol's, %(default)s)")
    ap.add_argument("--repeat", type=int, default=7,
                    help="timed repetitions after the warm-up; medians (default 7)")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args(argv)
    size = args.datagram_bytes
    if size < 32 + auth.AUTH_TRAILER_LEN:
        ap.error(f"--datagram-bytes {size}: a tagged data datagram has at least 56 bytes")
    n = max(1, args.size_mib * (1 << 20) // size)
    start = cpu_times()
    rng = np.random.default_rng(0)
    records = rng.integers(0, 256, (n, size), dtype=np.uint8)
    copy = np.empty_like(records)
    lengths = np.full(n, size, np.int64)
    rows = np.arange(n, dtype=np.int64)
    nonces = NonceCounter(0)
    batch = args.batch_packets
    small = max(1, n // 10)  # the per-datagram Python loops get a tenth of the buffer

    def seal(accelerated: bool, count: int) -> None:
        for start in range(0, count, batch):
            stop = min(start + batch, count)
            auth.seal_records(records, lengths, start, stop, KEY, nonces, accelerated=accelerated)

    def verify(accelerated: bool, count: int) -> None:
        for start in range(0, count, batch):
            stop = min(start + batch, count)
            ok = auth.verify_records(
                records, lengths, rows[start:stop], KEY, accelerated=accelerated
            )
            if not ok.all():
                raise RuntimeError("a sealed record did not verify: the benchmark is broken")

    def blake2b(count: int) -> None:
        for i in range(count):
            hashlib.blake2b(records[i, : size - 16].data, key=KEY, digest_size=16).digest()

    cases: dict[str, tuple[Callable[[], object], int]] = {
        "memcpy": (lambda: np.copyto(copy, records), n),
        "seal_py": (lambda: seal(False, small), small),
        "verify_py": (lambda: verify(False, small), small),
        "blake2b": (lambda: blake2b(small), small),
    }
    backends = ("modes", "evp") if auth.ACCELERATED else ()
    if backends:
        cases["seal_c"] = (lambda: seal(True, n), n)
        cases["verify_c"] = (lambda: verify(True, n), n)
    for backend in backends:
        cases[f"seal_c_{backend}"] = (_on(backend, lambda: seal(True, n)), n)
        cases[f"verify_c_{backend}"] = (_on(backend, lambda: verify(True, n)), n)
    for fn, _ in cases.values():  # warm-up: page faults, key schedules, imports
        fn()
    gbps: dict[str, list[float]] = {name: [] for name in cases}
    ratios: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for rep in range(args.repeat):
        # each repetition starts one case further on, so that no case always runs
        # after the same one (the caches and the CPU's clock it leaves behind)
        order = names[rep % len(names) :] + names[: rep % len(names)]
        this = {name: cases[name][1] * size / _timed(cases[name][0]) / 1e9 for name in order}
        for name, value in this.items():
            gbps[name].append(value)
            ratios[name].append(value / this["memcpy"])
    result: dict[str, object] = {
        "datagram_bytes": size,
        "datagrams": n,
        "batch_packets": batch,
        "repeat": args.repeat,
        "accelerated": auth.ACCELERATED,
        "gmac_backend": auth.gmac_backend(),
    }
    print(f"{'':15}{'GB/s':>8}{'/ memcpy':>10}")
    for name in cases:
        g, r = statistics.median(gbps[name]), statistics.median(ratios[name])
        result[f"{name}_gbps"] = round(g, 3)
        result[f"{name}_ratio"] = round(r, 4)
        print(f"{name:15}{g:8.3f}{r:10.4f}")
    result["machine"] = describe(start, cpu_times())
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
