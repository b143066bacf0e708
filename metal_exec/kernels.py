"""Reference numpy kernels for the ops small ggml graphs use.

A kernel takes the node, its source values (arrays shaped (ne3, ne2, ne1, ne0),
None for empty slots) and scalar parameters, and returns the node's value in
that shape. Both the planned run and the private-memory reference use the same
kernels, so any difference between them comes from memory, not arithmetic.
Inputs are copied before a kernel runs, so inplace plans compute correctly.
"""
from __future__ import annotations

import numpy as np

DTYPES = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i16": np.int16, "i8": np.int8,
          "i64": np.int64, "f64": np.float64}

DEFAULTS = {"eps": 1e-5, "n_past": 0, "scale": 1.0, "rope_mode": 0, "freq_base": 10000.0}


class UnsupportedOp(ValueError):
    pass


def shape_of(t) -> tuple:
    return tuple(reversed(t.ne))


def _f(x):
    return np.asarray(x, dtype=np.float64)


def _tile_to(b, shape):
    """ggml's broadcast: b repeats along every dimension whose size divides the target's."""
    if b.shape == tuple(shape):
        return b
    reps = []
    for have, want in zip(b.shape, shape):
        if have == 0 or want % have:
            raise UnsupportedOp(f"cannot repeat shape {b.shape} to {tuple(shape)}")
        reps.append(want // have)
    return np.tile(b, reps)


def get_rows(node, srcs, p):
    rows = srcs[0].reshape(-1, srcs[0].shape[-1])
    idx = np.asarray(srcs[1]).reshape(-1).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= rows.shape[0]):
        idx = np.clip(idx, 0, rows.shape[0] - 1)  # garbage indices from corrupted memory
    return _f(rows[idx]).reshape(shape_of(node))


def norm(node, srcs, p):
    x = _f(srcs[0])
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + p["eps"])


def rms_norm(node, srcs, p):
    x = _f(srcs[0])
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + p["eps"])


def _binary(fn):
    def kernel(node, srcs, p):
        a = _f(srcs[0])
        return fn(a, _tile_to(_f(srcs[1]), a.shape))
    return kernel


def scale(node, srcs, p):
    factor = float(_f(srcs[1]).reshape(-1)[0]) if len(srcs) > 1 and srcs[1] is not None else p["scale"]
    return _f(srcs[0]) * factor


def mul_mat(node, srcs, p):
    """ggml_mul_mat(a, b): out[n][m] = sum_k a[m][k] * b[n][k]; a broadcasts over b's batch dims."""
    a, b = _f(srcs[0]), _f(srcs[1])
    for axis in (0, 1):
        if a.shape[axis] != b.shape[axis]:
            a = np.repeat(a, b.shape[axis] // a.shape[axis], axis=axis)
    return np.matmul(b, np.swapaxes(a, -1, -2))


def diag_mask_inf(node, srcs, p):
    x = _f(srcs[0]).copy()
    n1, n0 = x.shape[-2], x.shape[-1]
    mask = np.arange(n0)[None, :] > (p["n_past"] + np.arange(n1)[:, None])
    x[..., mask] = -np.inf
    return x


def soft_max(node, srcs, p):
    x = _f(srcs[0])
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def rope(node, srcs, p):
    """Rotary embedding; position of row i2 is pos[i2] (head: src1) or n_past + i2 (2023)."""
    x = _f(srcs[0]).copy()
    n_dims = int(p.get("n_dims") or x.shape[-1])
    ne2 = x.shape[1]
    if len(srcs) > 1 and srcs[1] is not None:
        pos = _f(srcs[1]).reshape(-1)[:ne2]
    else:
        pos = p["n_past"] + np.arange(ne2, dtype=np.float64)
    theta_scale = p["freq_base"] ** (-2.0 / n_dims)
    theta = pos[:, None] * theta_scale ** np.arange(n_dims // 2)[None, :]
    cos, sin = np.cos(theta)[None, :, None, :], np.sin(theta)[None, :, None, :]
    if p["rope_mode"] & 2:  # neox: pairs (i, i + n_dims/2)
        i0, i1 = slice(0, n_dims // 2), slice(n_dims // 2, n_dims)
    else:  # adjacent pairs (i, i + 1)
        i0, i1 = slice(0, n_dims, 2), slice(1, n_dims, 2)
    x0, x1 = x[..., i0].copy(), x[..., i1].copy()
    x[..., i0] = x0 * cos - x1 * sin
    x[..., i1] = x0 * sin + x1 * cos
    return x


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


UNARY = {
    "GELU": _gelu,
    "SILU": lambda x: x / (1.0 + np.exp(-x)),
    "RELU": lambda x: np.maximum(x, 0.0),
    "TANH": np.tanh,
    "GELU_QUICK": lambda x: x / (1.0 + np.exp(-1.702 * x)),
}


def unary_name(node, p) -> str:
    """Which unary op: the params, ggml_op_desc, a 2023 op of its own, or the node's name."""
    for name in (p.get("unary"), node.op_desc, node.op):
        if name and name.upper() in UNARY:
            return name.upper()
    lowered = node.name.lower()
    for name in UNARY:
        if name.lower() in lowered:
            return name
    return "GELU"


def unary(node, srcs, p):
    return UNARY[unary_name(node, p)](_f(srcs[0]))


def repeat(node, srcs, p):
    return _tile_to(_f(srcs[0]), shape_of(node))


def copy(node, srcs, p):
    """CPY / CONT / DUP: the same elements in logical order, in the node's shape and type."""
    src = np.asarray(srcs[0])
    if src.size != int(np.prod(shape_of(node))):
        raise UnsupportedOp(f"{node.op} {node.name}: {src.size} elements into {shape_of(node)}")
    return src.reshape(shape_of(node))


KERNELS = {
    "GET_ROWS": get_rows, "NORM": norm, "RMS_NORM": rms_norm,
    "ADD": _binary(np.add), "MUL": _binary(np.multiply), "SUB": _binary(np.subtract), "DIV": _binary(np.divide),
    "SCALE": scale, "MUL_MAT": mul_mat, "DIAG_MASK_INF": diag_mask_inf, "SOFT_MAX": soft_max, "ROPE": rope,
    "UNARY": unary, "GELU": unary, "SILU": unary, "RELU": unary, "REPEAT": repeat,
    "CPY": copy, "CONT": copy, "DUP": copy,
}


def compute(node, srcs: list, params: dict | None = None) -> np.ndarray:
    """The node's value, cast to its type, shaped (ne3, ne2, ne1, ne0)."""
    kernel = KERNELS.get(node.op)
    if kernel is None:
        raise UnsupportedOp(f"no kernel for {node.op} (node {node.name})")
    p = dict(DEFAULTS, **(params or {}))
    with np.errstate(all="ignore"):
        out = kernel(node, srcs, p)
        return np.asarray(out).astype(DTYPES[node.type]).reshape(shape_of(node))
