"""Every several-token GEMV (TMAX 4, 5, 8, 16: the verify steps' products) gives each token the bits
the one-token GEMV gives it alone: the exact verify's foundation. The several-token kernels reduce their
sums with a reduce-scatter (kernels/gemv.cu, warp_sum_scatter), the one-token ones with warp_sum. GPU only.

A broken build (another lane order, still within rounding of the right sums: cuda_helpers.BROKEN_KERNELS["gemv_rs"])
fails the fp32-output tests, and one whose tensor-core tokens read the next token's inputs ("gemv_tc") the tc tests."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_helpers import needs_gpu, round_bf16, up, use_broken_kernels

pytestmark = [pytest.mark.gpu, needs_gpu]

SHAPES = [(37, 264), (1536, 1536), (515, 8960), (1000, 72), (8, 2056)]  # N, K


def grid(tm, N):
    return ((N + 3) // 4 if tm <= 8 else (N + 1) // 2,)


def one_token_rows(name1, w, x, N_out, extra, counter=None):
    """Row t = the one-token kernel's output for token t alone (fp32 or bf16 bits)."""
    import cupy as cp

    from minitorch.cuda.runtime import kernels

    z = np.uint64(0)
    rows = []
    for t in range(x.shape[0]):
        xt = up(x[t:t + 1], "bfloat16")
        K = x.shape[1]
        dims = (np.int32(w.shape[0]), np.int32(K), np.int32(1), np.int32(K))
        if extra == "yf":
            y = cp.full((1, N_out), np.nan, cp.float32)
            kernels().launch(name1, ((w.shape[0] + 3) // 4,), (256,),
                             (up(w, "bfloat16").storage, xt.storage, z, np.float32(0), z, y, z) + dims)
        else:
            y = cp.full((1, N_out), 0x7FC0, cp.uint16)
            kernels().launch(name1, ((w.shape[0] + 3) // 4,), (256,),
                             (up(w, "bfloat16").storage, xt.storage, z, np.float32(0), y, z, z) + dims + (counter,))
        rows.append(y.get()[0])
    return np.stack(rows)


@pytest.mark.parametrize("tm", [4, 5, 8, 16])
@pytest.mark.parametrize("N,K", SHAPES)
def test_several_token_gemv_equals_one_token_gemv_bitwise(tm, N, K):
    import cupy as cp

    from minitorch.cuda.runtime import kernels

    r = np.random.default_rng(tm * 7919 + N + K)
    w = (r.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    z = np.uint64(0)
    for T in sorted({1, max(1, tm // 2 + 1), tm}):
        x = r.standard_normal((T, K)).astype(np.float32)
        y = cp.full((T, N), np.nan, cp.float32)  # poisoned: every element must be written
        kernels().launch(f"gemv{tm}_bf16", grid(tm, N), (256,),
                         (up(w, "bfloat16").storage, up(x, "bfloat16").storage, z, np.float32(0), z, y, z,
                          np.int32(N), np.int32(K), np.int32(T), np.int32(K)))
        np.testing.assert_array_equal(y.get(), one_token_rows("gemv1_bf16", w, x, N, "yf"))


@pytest.mark.parametrize("tm", [4, 5, 8, 16])
@pytest.mark.parametrize("I,K", [(333, 1000), (4480, 1536), (37, 2056)])
def test_several_token_gusilu_equals_one_token_bitwise(tm, I, K):
    import cupy as cp

    from minitorch.cuda.runtime import kernels

    r = np.random.default_rng(tm * 31 + I + K)
    w = (r.standard_normal((2 * I, K)) / np.sqrt(K)).astype(np.float32)  # interleaved gate/up rows
    counter = cp.zeros(1, cp.uint32)
    z = np.uint64(0)
    T = tm
    x = r.standard_normal((T, K)).astype(np.float32)
    act = cp.full((T, I), 0x7FC0, cp.uint16)
    kernels().launch(f"gemv{tm}_gusilu_bf16", grid(tm, 2 * I), (256,),
                     (up(w, "bfloat16").storage, up(x, "bfloat16").storage, z, np.float32(0), act, z, z,
                      np.int32(2 * I), np.int32(K), np.int32(T), np.int32(K), counter))
    np.testing.assert_array_equal(act.get(), one_token_rows("gemv1_gusilu_bf16", w, x, I, "yb", counter))


# ----------------------------------------------------------------------------- tensor-core GEMV (gemv="tc")
# gemvtc8 (1..8 tokens) and gemvtc16 (1..16 tokens): mma.m16n8k16 with the tokens as the A rows. A broken build
# (token t's sums read token t + 1's inputs: cuda_helpers.BROKEN_KERNELS["gemv_tc"]) fails both tests below.
TC_SHAPES = [(37, 264), (1536, 1536), (515, 8960), (1000, 72), (8, 2056), (896, 4864)]  # N, K


def tc_launch(tt, w_dev, x, N, K):  # tt: "8", "8w", "16" or "16w" (w: 16 rows a block)
    import cupy as cp

    from minitorch.cuda.runtime import kernels

    z = np.uint64(0)
    T = x.shape[0]
    y = cp.full((T, N), np.nan, cp.float32)  # poisoned: every element must be written
    rows = 16 if str(tt).endswith("w") else 8
    kernels().launch(f"gemvtc{tt}_bf16", ((N + rows - 1) // rows,), (256,),
                     (w_dev, up(x, "bfloat16").storage, z, np.float32(0), z, y, z,
                      np.int32(N), np.int32(K), np.int32(T), np.int32(K)))
    return y.get()


TC_KERNELS = ["8", "8w", "16", "16w"]  # gemvtc{..}_bf16: tokens at most 8 / 16, w = 16 rows a block


def tc_case(tt, N, K, salt):
    """(most tokens the kernel takes, the generator, an (N, K) weight) of one test case."""
    tmax = int(tt.rstrip("w"))
    r = np.random.default_rng(tmax * salt + N + K)
    return tmax, r, (r.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)


@pytest.mark.parametrize("tt", TC_KERNELS)
@pytest.mark.parametrize("N,K", TC_SHAPES)
def test_tc_gemv_matches_float64_reference(tt, N, K):
    """The product of the bf16-rounded inputs, within fp32 accumulation error of the float64 sum."""
    T, r, w = tc_case(tt, N, K, 131)
    x = r.standard_normal((T, K)).astype(np.float32)
    wb, xb = round_bf16(w).astype(np.float64), round_bf16(x).astype(np.float64)
    ref = xb @ wb.T
    mag = np.abs(xb) @ np.abs(wb).T  # sum of |terms|: fp32 accumulation error is a small multiple of eps x this
    got = tc_launch(tt, up(w, "bfloat16").storage, x, N, K)
    assert np.all(np.abs(got - ref) <= 1e-5 * mag + 1e-30)


@pytest.mark.parametrize("tt", TC_KERNELS)
@pytest.mark.parametrize("N,K", TC_SHAPES)
def test_tc_gemv_tokens_equal_one_token_bitwise(tt, N, K):
    """Each token of a several-token launch (any of the four kernels) gets the bits gemvtc8 gives it alone."""
    tmax, r, w = tc_case(tt, N, K, 7)
    wd = up(w, "bfloat16").storage
    for T in sorted({1, 3, tmax // 2 + 1, tmax}):
        x = r.standard_normal((T, K)).astype(np.float32)
        alone = np.concatenate([tc_launch(8, wd, x[t:t + 1], N, K) for t in range(T)])
        np.testing.assert_array_equal(tc_launch(tt, wd, x, N, K), alone)


def test_several_token_gemvs_summing_lanes_in_another_order_fail(monkeypatch):
    """The fp32-output kernels show another lane order: on an H100 the broken 5-token GEMV differed from the real one in
    993 of 1,536 outputs (docs/results/h100_trees_specbench/diag_rs.log). The SwiGLU kernels are not among the cases:
    their bf16 outputs hide a last-bit change of the fp32 sums (a bf16 rounds away 16 bits, so one output in tens of
    thousands would change), and with them in, this test did not raise on that H100."""
    use_broken_kernels(monkeypatch, "gemv_rs")
    for check in (lambda: test_several_token_gemv_equals_one_token_gemv_bitwise(5, 1536, 1536),
                  lambda: test_several_token_gemv_equals_one_token_gemv_bitwise(8, 1536, 1536),
                  lambda: test_several_token_gemv_equals_one_token_gemv_bitwise(16, 515, 8960)):
        with pytest.raises(AssertionError):
            check()


def test_tc_gemv_reading_the_next_tokens_inputs_fails(monkeypatch):
    use_broken_kernels(monkeypatch, "gemv_tc")
    for check in (lambda: test_tc_gemv_matches_float64_reference("8", 1536, 1536),
                  lambda: test_tc_gemv_tokens_equal_one_token_bitwise("16w", 515, 8960)):
        with pytest.raises(AssertionError):
            check()
