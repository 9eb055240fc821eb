"""Op groups of the fuzzer's writers mode (bench/fuzz.py --writers), beside
tests/op_catalogue.py's: the calls leapp's ONNX writer has rules for that the
catalogue leaves out, with dtype and broadcasting corners (float16 chains,
integer and bool promotion, rounding modes), the maths of observation terms
(quaternions, atan2, normalize), sort/topk, recurrent cells and history shifts.

Each group takes (x, y) of shape (2, 3, 4) and returns a dict of named outputs;
the writers-mode programs paste this file after the catalogue, so a saved case
runs as-is.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(1)
GRU_CELL = nn.GRUCell(4, 4).eval()
LSTM_CELL = nn.LSTMCell(4, 4).eval()
GRU = nn.GRU(4, 4, batch_first=True).eval()
LSTM = nn.LSTM(4, 4, num_layers=2, batch_first=True).eval()
PRELU_W = torch.tensor([0.1, 0.2, 0.3])
SCATTER_IDX = torch.tensor([[[3, 0, 1, 2]]]).expand(2, 3, 4).contiguous()


def dtype_corners(x, y):
    return {
        "half_chain": (x.half() * 3.3).float(), "half_add": (x.half() + y.half()).float(),
        "half_out": x.half() * 2, "int_true_div": (x * 10).int() / 3,
        "long_floordiv": ((x * 10).long() // 3).float(),
        "long_mod": ((x * 10).long() % 3).float(), "bool_add": x + (y > 0),
        "int_times_float": (x * 10).int() * 2.5, "double_mix": (x.double() * y).float(),
        "double_out": x.double() + 1, "where_scalar": torch.where(x > 0, x, 0.5),
        "fmod": torch.fmod(x * 3, 0.7), "remainder": torch.remainder(x * 3, -0.7),
        "div_trunc": torch.div(x * 5, y.abs() + 1.5, rounding_mode="trunc"),
        "sign": torch.sign(x), "int_pow": x ** 3, "long_sum": (x * 10).long().sum(dim=1),
        "bool_count": (x > 0).sum(dim=-1), "mean_keep_int": (x > 0).float().mean(1, True),
    }


def maths_more(x, y):
    return {
        "atan2": torch.atan2(x, y), "hypot": torch.hypot(x, y), "copysign": torch.copysign(x, y),
        "lerp": torch.lerp(x, y, 0.3), "log1p": torch.log1p(x.abs()), "expm1": torch.expm1(x),
        "exp2": torch.exp2(x), "erf": torch.erf(x), "reciprocal": (x.abs() + 1).reciprocal(),
        "asin_tanh": torch.asin(torch.tanh(x)),
        "clamp_tensor": torch.clamp(x, min=y - 1, max=y + 1),
        "nan_to_num": torch.nan_to_num(torch.log(x), nan=0.0, neginf=-5.0),
        "square": torch.square(x), "log2": torch.log2(x.abs() + 1), "atan": torch.atan(x),
        "broadcast": x[:, :, :1] * y[:1, :1, :], "float_power": torch.float_power(x.abs(), 1.5),
    }


def quaternions(x, y):
    q = F.normalize(x, dim=-1)
    w, i, j, k = q.unbind(-1)
    v = y[..., :3]
    uv = torch.cross(q[..., 1:], v, dim=-1)
    rotated = v + 2.0 * (w.unsqueeze(-1) * uv + torch.cross(q[..., 1:], uv, dim=-1))
    yaw = torch.atan2(2.0 * (w * k + i * j), 1.0 - 2.0 * (j * j + k * k))
    conj = torch.cat([q[..., :1], -q[..., 1:]], dim=-1)
    return {
        "q": q, "conj": conj, "rotated": rotated, "yaw": yaw,
        "heading": torch.stack([torch.cos(yaw), torch.sin(yaw), w, k], dim=-1),
        "vnorm": torch.linalg.vector_norm(y, dim=-1, keepdim=True) * q,
        "dot": (q * F.normalize(y, dim=-1)).sum(-1),
    }


def selection(x, y):
    values, indices = torch.sort(x, dim=-1, descending=True)
    top, top_idx = torch.topk(y, 2, dim=1)
    low, low_idx = x.min(dim=-1, keepdim=True)
    return {
        "sorted": values, "sort_idx": indices, "argsort": torch.argsort(y, dim=0),
        "topk": top, "topk_idx": top_idx, "min_keep": low - x, "min_idx": low_idx,
        "take": torch.take_along_dim(y, indices, dim=-1),
        "scatter": torch.zeros(2, 3, 4).scatter(2, SCATTER_IDX, x),
        "compare": (x >= y).float() - (x != y).float() * (x <= 0.2).float(),
        "masked": x.masked_fill(y > 0.5, 2.0), "finite": torch.isfinite(x / y).float() * x,
        "logical": (torch.logical_and(x > 0, y < 0) | (x > 1)).float() + y,
    }


def recurrent_cells(x, y):
    h = GRU_CELL(x.reshape(6, 4), y.reshape(6, 4)).reshape(2, 3, 4)
    hx, cx = LSTM_CELL(x.reshape(6, 4), (y.reshape(6, 4), (y * 0.5).reshape(6, 4)))
    seq, last = GRU(x, y[:1, :2].reshape(1, 2, 4).contiguous())
    out, (hn, cn) = LSTM(y)
    return {
        "gru_cell": h, "lstm_h": hx.reshape(2, 3, 4), "lstm_c": cx.reshape(2, 3, 4),
        "gru_seq": seq, "gru_last": last, "lstm_seq": out, "lstm_hn": hn, "lstm_cn": cn,
    }


def history_shapes(x, y):
    return {
        "shift": torch.cat([x[:, 1:], y[:, :1]], dim=1), "pad": F.pad(x, (1, 0))[..., :4],
        "tril": torch.tril(x), "triu": torch.triu(y, diagonal=1),
        "tensor_split": torch.tensor_split(x, 3, dim=1)[1].expand(2, 3, 4),
        "movedim": torch.movedim(x, 0, 2).reshape(2, 3, 4),
        "expand_as": x[:, :1].expand_as(y) + y, "tile": torch.tile(x[..., :2], (1, 1, 2)),
        "swap": x.swapaxes(0, 1).flip(0).transpose(0, 1),
        "stacked": torch.stack([x, y], dim=-1).flatten(-2)[..., ::2],
    }


def activations_more(x, y):
    return {
        "softmin": F.softmin(x, dim=1), "glu": F.glu(torch.cat([x, y], -1), dim=-1),
        "logsigmoid": F.logsigmoid(x), "hardswish": F.hardswish(x * 3),
        "hardsigmoid": F.hardsigmoid(x * 3), "selu": F.selu(x), "celu": F.celu(x, 0.5),
        "softsign": F.softsign(x), "prelu": F.prelu(x, PRELU_W),
        "tanhshrink": F.tanhshrink(x), "gelu_tanh": F.gelu(y, approximate="tanh"),
        "softmax_half": F.softmax(x.half(), dim=-1).float(),
    }


ONNX_GROUPS = {
    "dtype_corners": ((torch.randn(2, 3, 4), torch.randn(2, 3, 4)), dtype_corners),
    "maths_more": ((torch.randn(2, 3, 4), torch.randn(2, 3, 4)), maths_more),
    "quaternions": ((torch.randn(2, 3, 4), torch.randn(2, 3, 4)), quaternions),
    "selection": ((torch.randn(2, 3, 4), torch.randn(2, 3, 4)), selection),
    "recurrent_cells": ((torch.randn(2, 3, 4), torch.randn(2, 3, 4)), recurrent_cells),
    "history_shapes": ((torch.randn(2, 3, 4), torch.randn(2, 3, 4)), history_shapes),
    "activations_more": ((torch.randn(2, 3, 4), torch.randn(2, 3, 4)), activations_more),
}
