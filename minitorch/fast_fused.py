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
    Works in chunks of 512 so the exponent scratch stays in L1."""
    kbuf = np.empty(512, dtype=np.int32)
    scale = kbuf.view(np.float32)
    for c0 in range(0, n, 512):
        c1 = min(c0 + 512, n)
        for i in range(c0, c1):
            x0 = a[i]
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
            a[i] = np.float32(0.0) if x0 < _LO else y
            kbuf[i - c0] = (np.int32(k) + np.int32(127)) << np.int32(23)
        for i in range(c0, c1):
            a[i] *= scale[i - c0]


@njit(inline="always", fastmath=True)
def _sum64(a, n):
    s = 0.0
    for i in range(n):
        s += np.float64(a[i])
    return s


@njit(inline="always", fastmath=True)
def _max(a, n):
    m = a[0]
    for i in range(1, n):
        m = max(m, a[i])
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
            ls = np.float32(np.log(_sum64(tmp, n)))
            for j in range(n):
                orow[j] -= ls
        else:
            _exp_inplace(orow, n)
            inv = np.float32(1.0 / _sum64(orow, n))
            for j in range(n):
                orow[j] *= inv


@njit(**JIT)
def rmsnorm_rows(out, x, w, rows, n, eps):
    for r in range(rows):
        base = r * n
        ss = 0.0
        for j in range(n):
            v = np.float64(x[base + j])
            ss += v * v
        inv = np.float32(1.0 / np.sqrt(ss / n + eps))
        for j in range(n):
            out[base + j] = (x[base + j] * inv) * w[j]


@njit(**JIT)
def layernorm_rows(out, x, w, b, rows, n, eps):
    for r in range(rows):
        base = r * n
        mu = 0.0
        for j in range(n):
            mu += x[base + j]
        mu /= n
        var = 0.0
        for j in range(n):
            d = x[base + j] - mu
            var += d * d
        inv = 1.0 / np.sqrt(var / n + eps)
        for j in range(n):
            out[base + j] = np.float32((x[base + j] - mu) * inv) * w[j] + b[j]


@njit(**JIT)
def rope_rows(out, x, cos, sin, cst, csd, sst, ssd, rows, t_len, d):
    """x/out contiguous (rows, T, D); cos/sin read at [t * cst + j * csd]."""
    h = d // 2
    for r in range(rows):
        for t in range(t_len):
            base = (r * t_len + t) * d
            cb = t * cst
            sb = t * sst
            for j in range(h):
                out[base + j] = x[base + j] * cos[cb + j * csd] - x[base + j + h] * sin[sb + j * ssd]
            for j in range(h, d):
                out[base + j] = x[base + j] * cos[cb + j * csd] + x[base + j - h] * sin[sb + j * ssd]


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
    _exp_inplace(out, n)
    for i in range(n):
        out[i] = g[i] / (np.float32(1.0) + out[i]) * u[i]  # exp overflow -> inf -> 0


@njit(cache=True, error_model="numpy", nogil=True, parallel=True, fastmath=True)
def attention_kernel(out, q, qs, k, ks, v, vs, b_n, hq, hkv, t_len, d, length, scale, q_start):
    """Causal GQA attention. q (B,Hq,T,D) / k,v (B,Hkv,L,D) read through strides qs/ks/vs (4 each);
    out contiguous (B,Hq,T,D). Query t sees keys 0..q_start+t. One task per (batch, kv head): the G
    query heads sharing a kv head are done together so each K/V row is read once per query position."""
    g = hq // hkv
    for bk in prange(b_n * hkv):
        bi = bk // hkv
        kh = bk % hkv
        scores = np.empty((g, length), dtype=np.float32)
        qbuf = np.empty((g, d), dtype=np.float32)
        acc = np.zeros((g, d), dtype=np.float32)
        krow = np.empty(d, dtype=np.float32)
        kb = bi * ks[0] + kh * ks[1]
        vb = bi * vs[0] + kh * vs[1]
        for t in range(t_len):
            for gi in range(g):
                qb = bi * qs[0] + (kh * g + gi) * qs[1] + t * qs[2]
                for e in range(d):
                    qbuf[gi, e] = q[qb + e * qs[3]] * scale
            n_keys = min(q_start + t + 1, length)
            for j in range(n_keys):
                kp = kb + j * ks[2]
                if ks[3] == 1:
                    krow[:] = k[kp:kp + d]
                else:
                    for e in range(d):
                        krow[e] = k[kp + e * ks[3]]
                for gi in range(g):
                    s = np.float32(0.0)
                    for e in range(d):
                        s += qbuf[gi, e] * krow[e]
                    scores[gi, j] = s
            acc[:, :] = 0.0
            for gi in range(g):
                m = scores[gi, 0]
                for j in range(1, n_keys):
                    m = max(m, scores[gi, j])
                row = scores[gi]
                for j in range(n_keys):
                    row[j] -= m
                _exp_inplace(row, n_keys)
                tot = np.float32(0.0)
                for j in range(n_keys):
                    tot += row[j]
                inv = np.float32(1.0) / tot
                for j in range(n_keys):
                    scores[gi, j] *= inv
            for j in range(n_keys):
                vp = vb + j * vs[2]
                if vs[3] == 1:
                    krow[:] = v[vp:vp + d]
                else:
                    for e in range(d):
                        krow[e] = v[vp + e * vs[3]]
                for gi in range(g):
                    p = scores[gi, j]
                    for e in range(d):
                        acc[gi, e] += p * krow[e]
            for gi in range(g):
                ob = ((bi * hq + kh * g + gi) * t_len + t) * d
                for e in range(d):
                    out[ob + e] = acc[gi, e]
