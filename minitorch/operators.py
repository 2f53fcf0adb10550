"""Scalar operators: the pure-Python reference semantics of every elementwise op.

SimpleOps applies these one element at a time; FastOps' numba kernels implement the same
table by op code (minitorch/cpu/kernels.py UNARY / BINARY) and are tested against these.
"""
from __future__ import annotations

import math
from typing import Callable, Dict


def neg(x: float) -> float:
    return -x


def id_(x: float) -> float:
    return x


def inv(x: float) -> float:
    return 1.0 / x if x != 0 else math.copysign(math.inf, x)


def exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def log(x: float) -> float:
    if x > 0:
        return math.log(x)
    return -math.inf if x == 0 else math.nan


def sqrt(x: float) -> float:
    return math.sqrt(x) if x >= 0 else math.nan


def rsqrt(x: float) -> float:
    if x > 0:
        return 1.0 / math.sqrt(x)
    return math.inf if x == 0 else math.nan


def sigmoid(x: float) -> float:
    # stable on both sides
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def relu(x: float) -> float:
    return x if x > 0 or x != x else 0.0


def silu(x: float) -> float:
    return x * sigmoid(x)


def tanh(x: float) -> float:
    return math.tanh(x)


def add(x: float, y: float) -> float:
    return x + y


def sub(x: float, y: float) -> float:
    return x - y


def mul(x: float, y: float) -> float:
    return x * y


def div(x: float, y: float) -> float:
    if y == 0:
        if x == 0 or x != x:
            return math.nan
        return math.copysign(math.inf, x) * math.copysign(1.0, y)
    return x / y


def pow_(x: float, y: float) -> float:
    try:
        return float(x) ** y if not (x < 0 and y != int(y)) else math.nan
    except (OverflowError, ZeroDivisionError):
        return math.inf


def lt(x: float, y: float) -> float:
    return 1.0 if x < y else 0.0


def gt(x: float, y: float) -> float:
    return 1.0 if x > y else 0.0


def eq(x: float, y: float) -> float:
    return 1.0 if x == y else 0.0


def max_(x: float, y: float) -> float:
    return x if x > y or x != x else y


UNARY: Dict[str, Callable[[float], float]] = {
    "neg": neg, "id": id_, "inv": inv, "exp": exp, "log": log, "sqrt": sqrt, "rsqrt": rsqrt,
    "sigmoid": sigmoid, "relu": relu, "silu": silu, "tanh": tanh,
}
BINARY: Dict[str, Callable[[float, float], float]] = {
    "add": add, "sub": sub, "mul": mul, "div": div, "pow": pow_, "lt": lt, "gt": gt, "eq": eq,
    "max": max_,
}
# ops whose result is float32 0/1 even on int64 inputs
COMPARISONS = frozenset({"lt", "gt", "eq"})
# ops that keep int64 when both inputs are int64
INT_CLOSED = frozenset({"neg", "id", "relu", "add", "sub", "mul", "max"})
