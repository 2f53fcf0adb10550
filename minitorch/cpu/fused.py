"""numba kernels for the fused ops FastOps provides: softmax, log_softmax, rmsnorm, layernorm, rope,
embedding, silu_mul and causal GQA attention over a (possibly strided) KV cache.

Row kernels take contiguous (rows, n) float32 data; attention takes explicit element strides so a
narrowed view of a preallocated KV cache is read in place.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

JIT = dict(cache=True, error_model="numpy", nogil=True, fastmath=False)


_LO = np.float32(-87.33)   # below: exp flushes to 0 (float32 normal range ends near here)
_HI = np.float32(88.72)    # above: exp is inf


@njit(inline="always", error_model="numpy")
def _exp_inplace(a, n):
    """a[:n] = exp(a[:n]) for float32 a, written so LLVM vectorizes it (numba's scalar np.exp is not):
    Cephes expf range reduction + degree-6 polynomial, 2**k built from exponent bits (~1 ulp).
    Chunks of 512 keep the exponent scratch in L1. Indexing goes through slice views with
    non-negative loop indices: an index that might be negative blocks vectorization."""
    kbuf = np.empty(512, dtype=np.int32)
    scale = kbuf.view(np.float32)
    for c0 in range(0, n, 512):
        ac = a[c0:min(c0 + 512, n)]
        for j in range(ac.shape[0]):
            x0 = ac[j]
            x = min(max(x0, _LO), _HI)
            k = np.floor(x * np.float32(1.44269504) + np.float32(0.5))
            r = x - k * np.float32(0.693359375) - k * np.float32(-2.12194440e-4)
            p = np.float32(1.9875691500e-4)
            p = p * r + np.float32(1.3981999507e-3)
            p = p * r + np.float32(8.3334519073e-3)
            p = p * r + np.float32(4.1665795894e-2)
            p = p * r + np.float32(1.6666665459e-1)
            p = p * r + np.float32(5.0000001201e-1)
            y = p * r * r + r + np.float32(1.0)
            ac[j] = np.float32(0.0) if x0 < _LO else y
            kbuf[j] = (np.int32(k) + np.int32(127)) << np.int32(23)
        for j in range(ac.shape[0]):
            ac[j] *= scale[j]


@njit(inline="always", fastmath=True)
def _sum_pos(a, n):
    """Sum of non-negative float32 values; fastmath lets LLVM split it into vector lanes (no
    cancellation, so the float32 lanes keep ~1e-6 relative accuracy)."""
    s = np.float32(0.0)
    for i in range(n):
        s += a[i]
    return s


@njit(inline="always", error_model="numpy")
def _max(a, n):
    """Max of a[:n] (n >= 1) over 16 independent lanes so it vectorizes."""
    mb = np.full(16, -np.inf, dtype=np.float32)
    n16 = n - n % 16
    for c in range(0, n16, 16):
        ac = a[c:c + 16]
        for lane in range(16):
            v = ac[lane]
            mb[lane] = v if v > mb[lane] else mb[lane]
    m = mb.max()
    for i in range(n16, n):
        if a[i] > m:
            m = a[i]
    return m


@njit(**JIT)
def softmax_rows(out, x, rows, n, log):
    for r in range(rows):
        xr = x[r * n:(r + 1) * n]
        orow = out[r * n:(r + 1) * n]
        m = _max(xr, n)
        if m == -np.inf:   # an all -inf row: softmax is nan, as in torch
            m = np.float32(0.0)
        for j in range(n):
            orow[j] = xr[j] - m
        if log:
            tmp = orow.copy()
            _exp_inplace(tmp, n)
            ls = np.float32(np.log(_sum_pos(tmp, n)))
            for j in range(n):
                orow[j] -= ls
        else:
            _exp_inplace(orow, n)
            inv = np.float32(1.0 / _sum_pos(orow, n))
            for j in range(n):
                orow[j] *= inv


@njit(**JIT)
def rmsnorm_rows(out, x, w, rows, n, eps):
    for r in range(rows):
        xr = x[r * n:(r + 1) * n]
        orow = out[r * n:(r + 1) * n]
        ss = 0.0
        for j in range(n):
            v = np.float64(xr[j])
            ss += v * v
        inv = np.float32(1.0 / np.sqrt(ss / n + eps))
        for j in range(n):
            orow[j] = (xr[j] * inv) * w[j]


@njit(**JIT)
def layernorm_rows(out, x, w, b, rows, n, eps):
    for r in range(rows):
        xr = x[r * n:(r + 1) * n]
        orow = out[r * n:(r + 1) * n]
        mu = 0.0
        for j in range(n):
            mu += xr[j]
        mu /= n
        var = 0.0
        for j in range(n):
            d = xr[j] - mu
            var += d * d
        inv = 1.0 / np.sqrt(var / n + eps)
        for j in range(n):
            orow[j] = np.float32((xr[j] - mu) * inv) * w[j] + b[j]


@njit(**JIT)
def rope_rows(out, x, cos, sin, cst, csd, sst, ssd, rows, t_len, d):
    """x/out contiguous (rows, T, D); cos/sin read at [t * cst + j * csd]."""
    h = d // 2
    for r in range(rows):
        for t in range(t_len):
            base = (r * t_len + t) * d
            xr = x[base:base + d]
            orow = out[base:base + d]
            c = cos[t * cst:]
            s = sin[t * sst:]
            for j in range(h):
                orow[j] = xr[j] * c[j * csd] - xr[j + h] * s[j * ssd]
            for j in range(h, d):
                orow[j] = xr[j] * c[j * csd] + xr[j - h] * s[j * ssd]


@njit(**JIT)
def embedding_rows(out, w, ids, n_ids, v, d):
    """out[i, :] = w[ids[i], :]; returns the position of the first out-of-range id, or -1."""
    for i in range(n_ids):
        t = ids[i]
        if t < 0 or t >= v:
            return i
    for i in range(n_ids):
        src = ids[i] * d
        dst = i * d
        for j in range(d):
            out[dst + j] = w[src + j]
    return -1


@njit(**JIT)
def silu_mul_flat(out, g, u, n):
    for i in range(n):
        out[i] = -g[i]
    _exp_inplace(out[:n], n)
    for i in range(n):
        out[i] = g[i] / (np.float32(1.0) + out[i]) * u[i]  # exp overflow -> inf -> 0


NO_MASK = np.zeros((0, 0), dtype=np.uint8)  # the attention kernels' mask argument of a causal step


@njit(cache=True, error_model="numpy", nogil=True, fastmath=True)
def _attend_task(out, q, qs, k, ks, v, vs, bi, kh, hq, hkv, t_len, d, length, scale, q_start, mask, mask_from):
    """One (batch, kv head) task: the G query heads sharing kv head kh, all T query positions, so each
    K/V row is read once per query position. q (B,Hq,T,D) / k,v (B,Hkv,L,D) read through strides
    qs/ks/vs (4 each); out contiguous (B,Hq,T,D). Query t sees keys 0..q_start+t; with a mask (T, W)
    (a tree step; NO_MASK: none) of the keys from mask_from on only those mask_from + j where
    mask[t, j] (the node itself and its ancestors). The keys a query sees are gathered in key order
    into one row of scores, so its sums run over the same values in the same order as a causal step
    over those keys."""
    g = hq // hkv
    tree = mask.shape[0] > 0
    scores = np.empty((g, length), dtype=np.float32)
    seen = np.empty(length, dtype=np.int64)
    qbuf = np.empty((g, d), dtype=np.float32)
    acc = np.empty((g, d), dtype=np.float32)
    rowbuf = np.empty(d, dtype=np.float32)
    kb = bi * ks[0] + kh * ks[1]
    vb = bi * vs[0] + kh * vs[1]
    for t in range(t_len):
        for gi in range(g):
            qb = bi * qs[0] + (kh * g + gi) * qs[1] + t * qs[2]
            qr = qbuf[gi]
            for e in range(d):
                qr[e] = q[qb + e * qs[3]] * scale
        n_keys = 0
        for j in range(min(q_start + t + 1, length)):   # scores = (q * scale) . k_j for the G heads
            if tree and j >= mask_from and mask[t, j - mask_from] == 0:
                continue
            seen[n_keys] = j
            kp = kb + j * ks[2]
            if ks[3] == 1:
                kr = k[kp:kp + d]
            else:
                for e in range(d):
                    rowbuf[e] = k[kp + e * ks[3]]
                kr = rowbuf
            for gi in range(g):
                qr = qbuf[gi]
                s = np.float32(0.0)
                for e in range(d):
                    s += qr[e] * kr[e]
                scores[gi, n_keys] = s
            n_keys += 1
        for gi in range(g):       # softmax over the visible keys
            row = scores[gi, :n_keys]
            m = _max(row, n_keys)
            for j in range(n_keys):
                row[j] -= m
            _exp_inplace(row, n_keys)
            inv = np.float32(1.0) / _sum_pos(row, n_keys)
            for j in range(n_keys):
                row[j] *= inv
        acc[:, :] = 0.0
        for c in range(n_keys):   # out = sum_j p_j v_j
            vp = vb + seen[c] * vs[2]
            if vs[3] == 1:
                vr = v[vp:vp + d]
            else:
                for e in range(d):
                    rowbuf[e] = v[vp + e * vs[3]]
                vr = rowbuf
            for gi in range(g):
                p = scores[gi, c]
                ar = acc[gi]
                for e in range(d):
                    ar[e] += p * vr[e]
        for gi in range(g):
            ob = ((bi * hq + kh * g + gi) * t_len + t) * d
            o = out[ob:ob + d]
            ar = acc[gi]
            for e in range(d):
                o[e] = ar[e]


@njit(cache=True, error_model="numpy", nogil=True)
def attention_serial(out, q, qs, k, ks, v, vs, b_n, hq, hkv, t_len, d, length, scale, q_start, mask, mask_from):
    """Causal GQA attention (mask: NO_MASK, or a tree step's, _attend_task), one thread (decode: little work, no
    thread wake-up cost)."""
    for bk in range(b_n * hkv):
        _attend_task(out, q, qs, k, ks, v, vs, bk // hkv, bk % hkv, hq, hkv, t_len, d, length, scale, q_start, mask,
                     mask_from)


@njit(cache=True, error_model="numpy", nogil=True, parallel=True)
def attention_parallel(out, q, qs, k, ks, v, vs, b_n, hq, hkv, t_len, d, length, scale, q_start, mask, mask_from):
    """Causal GQA attention (mask as attention_serial's), (batch, kv head) tasks spread over threads (prefill)."""
    for bk in prange(b_n * hkv):
        _attend_task(out, q, qs, k, ks, v, vs, bk // hkv, bk % hkv, hq, hkv, t_len, d, length, scale, q_start, mask,
                     mask_from)
