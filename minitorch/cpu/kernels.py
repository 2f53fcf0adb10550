"""numba kernels behind FastOps: strided map / zip / where / reduce / argmax over (storage, shape,
strides) in elements. Ops are selected by an integer code (UNARY / BINARY tables) so each kernel is
compiled once per dtype signature (cache=True: a second start loads them from __pycache__).

Layout convention: the index space is split into rows (all dims but the last) and the last dim;
row bases come from div/mod over the prefix dims, the inner loop walks the last dim by its stride.
"""
from __future__ import annotations

import numpy as np
from numba import njit

UNARY = {"neg": 0, "id": 1, "inv": 2, "exp": 3, "log": 4, "sqrt": 5, "rsqrt": 6, "sigmoid": 7,
         "relu": 8, "silu": 9, "tanh": 10}
BINARY = {"add": 0, "sub": 1, "mul": 2, "div": 3, "pow": 4, "lt": 5, "gt": 6, "eq": 7, "max": 8}
REDUCE = {"add": 0, "max": 1, "mul": 2}

JIT = dict(cache=True, error_model="numpy", nogil=True)


@njit(inline="always", error_model="numpy")
def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))  # branch-free; exp overflow gives inf -> 0


@njit(inline="always", error_model="numpy")
def _unary(op, x):
    if op == 0:
        return -x
    elif op == 1:
        return x
    elif op == 2:
        return 1.0 / x
    elif op == 3:
        return np.exp(x)
    elif op == 4:
        return np.log(x)
    elif op == 5:
        return np.sqrt(x)
    elif op == 6:
        return 1.0 / np.sqrt(x)
    elif op == 7:
        return _sigmoid(x)
    elif op == 8:
        return x if x > 0 else x * 0
    elif op == 9:
        return x * _sigmoid(x)
    return np.tanh(x)


@njit(inline="always", error_model="numpy")
def _binary(op, x, y):
    if op == 0:
        return x + y
    elif op == 1:
        return x - y
    elif op == 2:
        return x * y
    elif op == 3:
        return x / y
    elif op == 4:
        return np.power(x * 1.0, y * 1.0)
    elif op == 5:
        return 1.0 if x < y else 0.0
    elif op == 6:
        return 1.0 if x > y else 0.0
    elif op == 7:
        return 1.0 if x == y else 0.0
    return x if (x > y or x != x) else y


@njit(inline="always")
def _row_base(r, shape, s1, s2, s3, s4, nd):
    """Storage positions of row r (prefix dims 0..nd-2) for up to four stride vectors."""
    p1 = 0
    p2 = 0
    p3 = 0
    p4 = 0
    rem = r
    for d in range(nd - 2, -1, -1):
        n = shape[d]
        i = rem % n
        rem //= n
        p1 += i * s1[d]
        p2 += i * s2[d]
        p3 += i * s3[d]
        p4 += i * s4[d]
    return p1, p2, p3, p4


@njit(**JIT)
def map_flat(op, out, a, n):
    for i in range(n):
        out[i] = _unary(op, a[i])


@njit(**JIT)
def map_strided(op, out, shape, os, a, as_):
    nd = shape.shape[0]
    last = shape[nd - 1]
    rows = 1
    for d in range(nd - 1):
        rows *= shape[d]
    so, sa = os[nd - 1], as_[nd - 1]
    for r in range(rows):
        po, pa, _, _ = _row_base(r, shape, os, as_, os, os, nd)
        for j in range(last):
            out[po + j * so] = _unary(op, a[pa + j * sa])


@njit(**JIT)
def zip_flat(op, out, a, b, n):
    for i in range(n):
        out[i] = _binary(op, a[i], b[i])


@njit(**JIT)
def zip_flat_scalar(op, out, a, b, n, scalar_left):
    """One side is a single element (b[0]); the other is contiguous with n elements."""
    s = b[0]
    if scalar_left:
        for i in range(n):
            out[i] = _binary(op, s, a[i])
    else:
        for i in range(n):
            out[i] = _binary(op, a[i], s)


@njit(**JIT)
def zip_strided(op, out, shape, os, a, as_, b, bs):
    nd = shape.shape[0]
    last = shape[nd - 1]
    rows = 1
    for d in range(nd - 1):
        rows *= shape[d]
    so, sa, sb = os[nd - 1], as_[nd - 1], bs[nd - 1]
    for r in range(rows):
        po, pa, pb, _ = _row_base(r, shape, os, as_, bs, os, nd)
        for j in range(last):
            out[po + j * so] = _binary(op, a[pa + j * sa], b[pb + j * sb])


@njit(**JIT)
def where_strided(out, shape, os, c, cs, a, as_, b, bs):
    nd = shape.shape[0]
    last = shape[nd - 1]
    rows = 1
    for d in range(nd - 1):
        rows *= shape[d]
    so, sc, sa, sb = os[nd - 1], cs[nd - 1], as_[nd - 1], bs[nd - 1]
    for r in range(rows):
        po, pc, pa, pb = _row_base(r, shape, os, cs, as_, bs, nd)
        for j in range(last):
            if c[pc + j * sc] != 0:
                out[po + j * so] = a[pa + j * sa]
            else:
                out[po + j * so] = b[pb + j * sb]


@njit(**JIT)
def reduce_rows(op, out, a, shape, strides, n, stride):
    """out[r] = reduce over n elements (stride `stride`) starting at row r of the other dims."""
    nd = shape.shape[0] + 1
    for r in range(out.shape[0]):
        pa, _, _, _ = _row_base(r, shape, strides, strides, strides, strides, nd)
        if op == 0:
            acc = 0.0
            for j in range(n):
                acc += a[pa + j * stride]
            out[r] = acc
        elif op == 1:
            m = a[pa]
            for j in range(1, n):
                x = a[pa + j * stride]
                if x > m or x != x:
                    m = x
                    if x != x:
                        break
            out[r] = m
        else:
            acc = 1.0
            for j in range(n):
                acc *= a[pa + j * stride]
            out[r] = acc


@njit(**JIT)
def argmax_rows(out, a, shape, strides, n, stride):
    nd = shape.shape[0] + 1
    for r in range(out.shape[0]):
        pa, _, _, _ = _row_base(r, shape, strides, strides, strides, strides, nd)
        m = a[pa]
        bi = 0
        if m == m:
            for j in range(1, n):
                x = a[pa + j * stride]
                if x > m or x != x:
                    m = x
                    bi = j
                    if x != x:
                        break
        out[r] = bi
