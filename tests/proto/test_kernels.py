"""The data path's row kernels: the C accelerator and the numpy fallback give the
same bytes, refuse rows outside their buffers before writing anything, and the
accelerator is really built where a C compiler is present."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from dlcp.proto import kernels
from dlcp.proto.kernels import block_abs_mean, copy_rows, flat_rows, unpack_records

IMPLS = [
    False,
    pytest.param(
        True, marks=pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
    ),
]


def test_accelerator_is_built_where_a_compiler_is() -> None:
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not (shutil.which("cc") or shutil.which("gcc")) or not headers.exists():
        pytest.skip("no C compiler or Python headers here: the numpy fallback is expected")
    assert kernels.ACCELERATED, "dlcp.proto._kernels did not build although a compiler is here"


def _case(rng: np.random.Generator) -> dict[str, object]:
    nbytes = int(rng.integers(1, 200))
    n = int(rng.integers(0, 60))
    src_stride = nbytes + int(rng.integers(0, 40))
    dst_stride = nbytes + int(rng.integers(0, 40))
    src_rows = rng.permutation(n + int(rng.integers(0, 5)))[:n] if rng.random() < 0.6 else None
    dst_rows = rng.permutation(n + int(rng.integers(0, 5)))[:n] if rng.random() < 0.6 else None
    src_start, dst_start = int(rng.integers(0, 16)), int(rng.integers(0, 16))
    src_n = int(src_rows.max()) + 1 if src_rows is not None and n else n
    dst_n = int(dst_rows.max()) + 1 if dst_rows is not None and n else n
    return {
        "src": rng.integers(0, 256, src_start + src_n * src_stride + nbytes, dtype=np.uint8),
        "dst_len": dst_start + dst_n * dst_stride + nbytes,
        "src_rows": None if src_rows is None else src_rows.astype(np.int64),
        "dst_rows": None if dst_rows is None else dst_rows.astype(np.int64),
        "src_start": src_start,
        "dst_start": dst_start,
        "src_stride": src_stride,
        "dst_stride": dst_stride,
        "n": n,
        "nbytes": nbytes,
    }


def _reference(c: dict[str, object]) -> np.ndarray:
    """Row by row, the definition in the docstring."""
    src = c["src"]
    dst = np.zeros(c["dst_len"], np.uint8)
    for i in range(c["n"]):
        s = (
            c["src_start"]
            + (i if c["src_rows"] is None else int(c["src_rows"][i])) * c["src_stride"]
        )
        d = (
            c["dst_start"]
            + (i if c["dst_rows"] is None else int(c["dst_rows"][i])) * c["dst_stride"]
        )
        dst[d : d + c["nbytes"]] = src[s : s + c["nbytes"]]
    return dst


@pytest.mark.parametrize("accelerated", IMPLS)
@pytest.mark.parametrize("stream", [False, True])
def test_copy_rows_matches_the_definition(accelerated: bool, stream: bool) -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        c = _case(rng)
        dst = np.zeros(c["dst_len"], np.uint8)
        copy_rows(
            dst,
            c["dst_start"],
            c["dst_stride"],
            c["dst_rows"],
            c["src"],
            c["src_start"],
            c["src_stride"],
            c["src_rows"],
            c["n"],
            c["nbytes"],
            stream=stream,
            accelerated=accelerated,
        )
        np.testing.assert_array_equal(dst, _reference(c))


@pytest.mark.parametrize("accelerated", IMPLS)
@pytest.mark.parametrize(("which", "row"), [("dst", 10), ("dst", -1), ("src", 10), ("src", -3)])
def test_copy_rows_refuses_rows_outside_the_buffer_and_writes_nothing(
    accelerated: bool, which: str, row: int
) -> None:
    src = np.arange(40, dtype=np.uint8)
    dst = np.zeros(40, np.uint8)
    rows = np.array([0, 1, row], np.int64)
    kw = (
        {"dst_rows": rows, "src_rows": None}
        if which == "dst"
        else {"dst_rows": None, "src_rows": rows}
    )
    with pytest.raises(IndexError, match=which):
        copy_rows(
            dst, 0, 4, kw["dst_rows"], src, 0, 4, kw["src_rows"], 3, 4, accelerated=accelerated
        )
    assert not dst.any()


@pytest.mark.parametrize("accelerated", IMPLS)
@pytest.mark.parametrize("start", [2**63 - 5, 2**62, -1])
def test_copy_rows_refuses_a_start_far_outside_the_buffer(accelerated: bool, start: int) -> None:
    """start + row * stride + nbytes overflowed int64 in the C check, which then
    let the copy through (a segfault) where numpy refused it."""
    dst = np.zeros(64, np.uint8)
    with pytest.raises(IndexError, match="dst"):
        copy_rows(dst, start, 1, None, np.ones(64, np.uint8), 0, 1, None, 1, 10,
                  accelerated=accelerated)  # fmt: skip
    assert not dst.any()


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_c_copy_rows_names_a_wrong_row_type() -> None:
    # the wrapper converts rows to int64; the module itself refuses anything else
    dst = np.zeros(16, np.uint8)
    c_module = kernels._accel
    assert c_module is not None
    with pytest.raises(TypeError, match="src_rows must be an int64 array"):
        c_module.copy_rows(
            dst, 0, 4, None, dst.copy(), 0, 4, np.array([0, 1], np.int32), 2, 4, False
        )


def test_flat_rows_sees_payload_columns_of_records() -> None:
    records = np.arange(5 * 12, dtype=np.uint8).reshape(5, 12)
    payloads = records[:, 4:]
    flat, stride = flat_rows(payloads)
    assert stride == 12 and len(flat) == 4 * 12 + 8
    for i in range(5):
        np.testing.assert_array_equal(flat[i * stride : i * stride + 8], payloads[i])


@pytest.mark.parametrize("accelerated", IMPLS)
def test_block_abs_mean_is_the_sampled_mean(accelerated: bool) -> None:
    rng = np.random.default_rng(3)
    full = rng.standard_normal((50, 360)).astype(np.float32)
    full[4, 3] = np.nan
    full[5, 101] = np.inf
    starts = np.array([0, 100, 344], np.int64)
    got = block_abs_mean(full, starts, 16, accelerated=accelerated)
    want = (
        np.concatenate([np.abs(full[:, b : b + 16]) for b in starts], axis=1)
        .astype(np.float64)
        .mean(axis=1)
    )
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6)
    assert np.isnan(got[4]) and np.isinf(got[5])


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
@pytest.mark.parametrize("block", [16, 6])  # vectorised (a multiple of 4), and not
def test_c_block_abs_mean_adds_in_the_order_of_the_definition(block: int) -> None:
    # each chunk's |values| summed one by one in double, block by block in the
    # order of starts, then divided: the vectorised C sums several chunks at once
    # and must give these bits exactly (the magnitude classes depend on them)
    rng = np.random.default_rng(8)
    full = (rng.standard_normal((45, 200)) * rng.lognormal(0, 4, (45, 1))).astype(np.float32)
    full[3, 17], full[9, 2], full[12, 0], full[40, 1] = np.nan, -np.inf, -0.0, 1e-42
    starts = np.array([0, 50, 200 - block, 97], np.int64)
    # a row whose float32 mean depends on the order of the double additions: 64
    # and 2**-18 first, then values each below half a double ulp of the sum (lost
    # one by one), and the mean falls exactly between two float32 values; summed
    # in another order (the small values first) the sum is one ulp higher and the
    # mean rounds up
    sampled = np.concatenate([np.arange(b, b + block) for b in starts.tolist()])
    full[20, sampled] = -(2.0**-50)
    full[20, sampled[:2]] = 64.0, 2.0**-18
    want = np.empty(len(full), np.float32)
    for c, row in enumerate(full.tolist()):
        total = 0.0
        for b in starts.tolist():
            for value in row[b : b + block]:
                total += abs(value)
        want[c] = np.float32(total / (len(starts) * block))
    got = block_abs_mean(full, starts, block, accelerated=True)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("accelerated", IMPLS)
def test_block_abs_mean_refuses_blocks_past_the_row(accelerated: bool) -> None:
    full = np.zeros((3, 20), np.float32)
    with pytest.raises(IndexError, match="leave rows of 20"):
        block_abs_mean(full, np.array([8], np.int64), 16, accelerated=accelerated)


@pytest.mark.parametrize("accelerated", IMPLS)
def test_headers_unpack_to_native_order(accelerated: bool) -> None:
    from dlcp.proto.wire import HEADER_DTYPE, NATIVE_HEADER_DTYPE

    rng = np.random.default_rng(11)
    records = rng.integers(0, 256, (70, 100), dtype=np.uint8)
    native = unpack_records(records, HEADER_DTYPE, accelerated=accelerated)
    assert native.dtype == NATIVE_HEADER_DTYPE
    want = np.ascontiguousarray(records[:, :32]).view(HEADER_DTYPE)[:, 0]
    for name in HEADER_DTYPE.names:
        np.testing.assert_array_equal(native[name], want[name])


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_c_swap_records_refuses_a_field_past_the_record() -> None:
    c_module = kernels._accel
    assert c_module is not None
    buf = np.zeros(64, np.uint8)
    with pytest.raises(ValueError, match="field at 30 of 4 bytes"):
        c_module.swap_records(buf, 32, buf.copy(), 32, 2, 32, bytes([30, 4]))


@pytest.mark.parametrize("accelerated", IMPLS)
@pytest.mark.parametrize("stream", [False, True])
def test_gather_records_writes_header_and_payload_of_each_record(
    accelerated: bool, stream: bool
) -> None:
    from dlcp.proto.wire import HEADER_DTYPE, NATIVE_HEADER_DTYPE

    rng = np.random.default_rng(21)
    n_rec, nbytes, stride = 40, 100, 32 + 100 + 12
    src = rng.integers(0, 256, n_rec * nbytes, dtype=np.uint8)
    dst_rows = rng.permutation(n_rec)[:35].astype(np.int64)  # 5 records left alone
    src_rows = rng.permutation(n_rec)[:35].astype(np.int64)
    template = np.zeros((), NATIVE_HEADER_DTYPE)
    template["ver_type"], template["job"], template["msg_elems"] = 0x11, 0xBEEF, 123456
    fields = {
        "seq": rng.integers(0, 2**32, n_rec, dtype=np.int64),
        "layer": rng.integers(0, 2**16, n_rec).astype(np.uint16),
        "tclass": rng.integers(0, 256, n_rec).astype(np.uint8),
    }
    records = np.full((n_rec, stride), 0xAA, np.uint8)
    kernels.gather_records(
        records,
        HEADER_DTYPE,
        template,
        fields,
        dst_rows,
        src,
        nbytes,
        src_rows,
        35,
        nbytes,
        stream=stream,
        accelerated=accelerated,
    )
    headers = np.ascontiguousarray(records[:, :32]).view(HEADER_DTYPE)[:, 0]
    for i, (r, s) in enumerate(zip(dst_rows.tolist(), src_rows.tolist(), strict=True)):
        h = headers[r]
        assert (int(h["ver_type"]), int(h["job"]), int(h["msg_elems"])) == (0x11, 0xBEEF, 123456)
        assert int(h["seq"]) == int(fields["seq"][r]) and int(h["layer"]) == fields["layer"][r]
        assert int(h["tclass"]) == fields["tclass"][r] and int(h["offset"]) == 0, i
        np.testing.assert_array_equal(
            records[r, 32 : 32 + nbytes], src[s * nbytes : (s + 1) * nbytes]
        )
        assert (records[r, 32 + nbytes :] == 0xAA).all()  # past the payload: untouched
    untouched = np.setdiff1d(np.arange(n_rec), dst_rows)
    assert (records[untouched] == 0xAA).all()


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
@pytest.mark.parametrize("permuted", [False, True])
@pytest.mark.parametrize("nbytes", [0, 72])  # headers only (lent rounds), and with payload
def test_c_and_numpy_gather_the_same_records_over_many_header_blocks(
    permuted: bool, nbytes: int
) -> None:
    # the C kernel builds headers a block of records at a time, field by field:
    # more records than several blocks, not a multiple of one, every field of the
    # header, from arrays of each item size, in record order and permuted
    from dlcp.proto.wire import HEADER_DTYPE, NATIVE_HEADER_DTYPE

    rng = np.random.default_rng(5)
    n_rec = 203
    stride = 32 + nbytes
    template = np.zeros((), NATIVE_HEADER_DTYPE)
    template["ver_type"], template["job"], template["msg_elems"] = 0x11, 0xBEEF, 123456
    item_types = [np.uint8, np.uint16, np.uint32, np.int64]
    fields = {}
    for k, name in enumerate(n for n in NATIVE_HEADER_DTYPE.names or () if n != "ver_type"):
        width = HEADER_DTYPE[name].itemsize
        values = rng.integers(0, 2 ** (8 * width), n_rec, dtype=np.uint64)
        item = item_types[k % len(item_types)]
        if np.dtype(item).itemsize < width:
            item = np.int64
        fields[name] = values.astype(item)
    src = rng.integers(0, 256, n_rec * max(nbytes, 1), dtype=np.uint8)
    dst_rows = rng.permutation(n_rec).astype(np.int64) if permuted else None
    src_rows = rng.permutation(n_rec).astype(np.int64) if permuted else None
    built = []
    for accelerated in (False, True):
        records = np.full((n_rec, stride), 0xAA, np.uint8)
        kernels.gather_records(
            records, HEADER_DTYPE, template, fields, dst_rows, src, nbytes, src_rows, n_rec,
            nbytes, accelerated=accelerated,
        )  # fmt: skip
        built.append(records)
    np.testing.assert_array_equal(built[1], built[0])
    headers = built[1][:, :32].copy().view(HEADER_DTYPE)[:, 0]
    assert (headers["seq"] == fields["seq"]).all() and (headers["job"] == fields["job"]).all()


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_c_gather_records_refuses_a_field_array_that_is_too_short() -> None:
    from dlcp.proto.wire import HEADER_DTYPE, NATIVE_HEADER_DTYPE

    records = np.zeros((4, 64), np.uint8)
    with pytest.raises(IndexError, match="field 0 holds 2 values"):
        kernels.gather_records(
            records,
            HEADER_DTYPE,
            np.zeros((), NATIVE_HEADER_DTYPE),
            {"seq": np.arange(2, dtype=np.int64)},
            None,
            np.zeros(64, np.uint8),
            16,
            None,
            4,
            16,
        )
    assert not records.any()


@pytest.mark.parametrize("accelerated", IMPLS)
def test_unpack_uniform_says_whether_rows_share_the_masked_bytes(accelerated: bool) -> None:
    from dlcp.proto.wire import HEADER_DTYPE

    rng = np.random.default_rng(4)
    rows = np.tile(rng.integers(0, 256, 80, dtype=np.uint8), (30, 1))
    rows[:, 12:20] = rng.integers(0, 256, (30, 8), dtype=np.uint8)  # unmasked bytes vary
    mask = bytes([0xFF] * 12 + [0] * 8 + [0xFF] * 12)
    native, same = kernels.unpack_uniform(rows, HEADER_DTYPE, mask, accelerated=accelerated)
    assert same and len(native) == 30
    rows[17, 3] ^= 0x10  # a masked bit differs in one row
    assert not kernels.unpack_uniform(rows, HEADER_DTYPE, mask, accelerated=accelerated)[1]
    np.testing.assert_array_equal(
        kernels.unpack_uniform(rows, HEADER_DTYPE, mask, accelerated=accelerated)[0],
        kernels.unpack_records(rows, HEADER_DTYPE, accelerated=False),
    )


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_c_gather_records_refuses_a_field_offset_near_the_int_limit() -> None:
    # offset + size overflowed an int and passed the header check: a write far
    # outside the record (a segfault); only a direct call can name such an offset
    # (the loaded build: make sanitize's where DLCP_KERNELS_BUILD names it)
    accel = kernels._accel
    assert accel is not None
    dst = np.zeros(4 * 64, np.uint8)
    field = (2**31 - 4, 8, np.arange(4, dtype=np.int64))
    with pytest.raises(ValueError, match="8 bytes at 2147483644 do not fit a 32-byte header"):
        accel.gather_records(dst, 64, 32, None, np.zeros(64, np.uint8), 16, None, 4, 16,
                                bytes(32), [field], False)  # fmt: skip
    assert not dst.any()


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_another_build_of_the_accelerator_is_loaded_where_a_variable_names_one(
    tmp_path: Path,
) -> None:
    """DLCP_KERNELS_BUILD (make sanitize's build with AddressSanitizer) is loaded in
    place of the package's own; a file that is no such build is refused by name."""
    own = kernels._accel.__file__  # type: ignore[union-attr]
    copy = tmp_path / "kernels_copy.so"
    shutil.copyfile(own, copy)
    probe = "from dlcp.proto import kernels; print(kernels._accel.__file__, kernels.ACCELERATED)"
    env = {**os.environ, kernels.BUILD_VARIABLE: str(copy)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(copy), "True"]
    not_a_build = tmp_path / "notes.txt"
    not_a_build.write_text("not a shared object\n")
    env[kernels.BUILD_VARIABLE] = str(not_a_build)
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert (
        f"ConfigError: DLCP_KERNELS_BUILD='{not_a_build}' is not a build of dlcp.proto._kernels"
        in out.stderr
    )
