"""Attention: F.scaled_dot_product_attention, and F.multi_head_attention_forward
(nn.MultiheadAttention, nn.TransformerEncoderLayer's attention) in evaluation, each
in eager's order of operations.  No dropout: a random draw no export reproduces."""
from __future__ import annotations

import math
from typing import Any

import torch

from ..emit import Call, Value, rule
from .common import example, finish, float_work, nan_flags, operand


def _sdpa(call: Call, q: str, k: str, v: str, rank: int, length: int, source: int,
          scale: float, work: torch.dtype, bool_mask: str | None = None,
          add_mask: str | None = None, causal: bool = False) -> str:
    """softmax(q·kᵀ·scale + mask)·v over the last two axes; a row with no finite score
    gives zeros, as eager's kernel does."""
    e = call.e
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    scores = e.op("Mul", [e.op("MatMul", [q, e.op("Transpose", [k], perm=perm)]),
                          e.const(scale, work)])
    if causal:
        allowed = torch.ones(length, source, dtype=torch.bool).tril()
        bias = torch.zeros(length, source, dtype=work).masked_fill(~allowed, float("-inf"))
        scores = e.op("Add", [scores, e.tensor_const(bias)])
    if bool_mask is not None:  # added as 0 / -inf, as eager's: a NaN score stays NaN
        scores = e.op("Add", [scores, e.op("Where", [bool_mask, e.const(0.0, work),
                                                     e.const(float("-inf"), work)])])
    if add_mask is not None:
        scores = e.op("Add", [scores, add_mask])
    weights = e.op("Softmax", [scores], axis=-1)
    # eager's kernel gives zeros for a row whose every score is -inf (every key hidden,
    # or a -inf query), unless a NaN reaches it (ReduceMax passes over NaN: counted apart)
    top = e.reduce("ReduceMax", scores, [rank - 1], True)
    nan = e.reduce("ReduceMax", nan_flags(call, scores, work), [rank - 1], True)
    empty = e.op("And", [e.op("Equal", [top, e.const(float("-inf"), work)]),
                         e.op("Equal", [nan, e.const(0.0, work)])])
    weights = e.op("Where", [empty, e.const(0.0, work), weights])
    return e.op("MatMul", [weights, v])


@rule("scaled_dot_product_attention")
def scaled_dot_product_attention(call: Call) -> str:
    """softmax(q·kᵀ·scale + mask)·v, the causal mask as a constant; no dropout."""
    work = float_work(call)
    q, k, v = call.args[0], call.arg(1, "key"), call.arg(2, "value")
    mask = call.arg(3, "attn_mask")
    if float(call.arg(4, "dropout_p", 0.0)) != 0.0:
        raise call.refuse("attention dropout")
    causal = bool(call.arg(5, "is_causal", False))
    scale = call.kwargs.get("scale")
    if call.kwargs.get("enable_gqa"):
        raise call.refuse("grouped-query attention")
    scale = 1.0 / (q.shape[-1] ** 0.5) if scale is None else float(scale)
    qv, kv, vv = (operand(call, t, work) for t in (q, k, v))
    bool_mask = add_mask = None
    if isinstance(mask, Value) and mask.dtype == torch.bool:
        bool_mask = mask.name
    elif mask is not None:
        add_mask = operand(call, mask, work)
    out = _sdpa(call, qv, kv, vv, q.rank, q.shape[-2], k.shape[-2], scale, work,
                bool_mask, add_mask, causal)
    return finish(call, out, work)


#: F.multi_head_attention_forward's parameters, in order, with their defaults.
_MHA_PARAMS = (
    ("query", None), ("key", None), ("value", None), ("embed_dim_to_check", None),
    ("num_heads", None), ("in_proj_weight", None), ("in_proj_bias", None), ("bias_k", None),
    ("bias_v", None), ("add_zero_attn", False), ("dropout_p", 0.0), ("out_proj_weight", None),
    ("out_proj_bias", None), ("training", True), ("key_padding_mask", None),
    ("need_weights", True), ("attn_mask", None), ("use_separate_proj_weight", False),
    ("q_proj_weight", None), ("k_proj_weight", None), ("v_proj_weight", None),
    ("static_k", None), ("static_v", None), ("average_attn_weights", True),
    ("is_causal", False))


def _linear(call: Call, x: str, weight: str, bias: str | None) -> str:
    e = call.e
    y = e.op("MatMul", [x, e.op("Transpose", [weight], perm=[1, 0])])
    return e.op("Add", [y, bias]) if bias is not None else y


def _rows(call: Call, name: str | None, start: int, stop: int) -> str | None:
    """name[start:stop] along axis 0 (a packed projection's part)."""
    if name is None:
        return None
    e = call.e
    return e.op("Slice", [name, e.ints([start]), e.ints([stop]), e.ints([0])])


def _canonical_mask(call: Call, mask: Any, work: torch.dtype) -> str | None:
    """eager's _canonical_mask: a boolean mask as 0 / -inf in the query's type."""
    if mask is None:
        return None
    e = call.e
    if isinstance(mask, Value) and mask.dtype == torch.bool:
        return e.op("Where", [mask.name, e.const(float("-inf"), work), e.const(0.0, work)])
    if isinstance(mask, Value) and not mask.dtype.is_floating_point:
        raise call.refuse(f"an attention mask of dtype {mask.dtype}")
    return operand(call, mask, work)


def _projections(call: Call, p: dict[str, Any], names: list[str], embed: int,
                 work: torch.dtype) -> tuple[str, str, str]:
    """q, k, v as eager's in-projection computes them: one packed product for the
    operands that are the same tensor."""
    query, key, value = names
    same_qk, same_kv = (p["query"] is p["key"]), (p["key"] is p["value"])
    e = call.e
    bias = operand(call, p["in_proj_bias"], work) if p["in_proj_bias"] is not None else None
    if p["use_separate_proj_weight"]:
        weights = [operand(call, p[f"{x}_proj_weight"], work) for x in "qkv"]
        return tuple(_linear(call, x, w, _rows(call, bias, i * embed, (i + 1) * embed))
                     for i, (x, w) in enumerate(zip((query, key, value), weights)))
    weight = operand(call, p["in_proj_weight"], work)
    if same_qk and same_kv:  # self-attention: one product, split in three
        packed = _linear(call, query, weight, bias)
        return tuple(e.op("Split", [packed, e.ints([embed] * 3)], outputs=3, axis=-1))
    q = _linear(call, query, _rows(call, weight, 0, embed), _rows(call, bias, 0, embed))
    if same_kv:
        packed = _linear(call, key, _rows(call, weight, embed, 3 * embed),
                         _rows(call, bias, embed, 3 * embed))
        k, v = e.op("Split", [packed, e.ints([embed] * 2)], outputs=2, axis=-1)
        return q, k, v
    k = _linear(call, key, _rows(call, weight, embed, 2 * embed),
                _rows(call, bias, embed, 2 * embed))
    v = _linear(call, value, _rows(call, weight, 2 * embed, 3 * embed),
                _rows(call, bias, 2 * embed, 3 * embed))
    return q, k, v


@rule("multi_head_attention_forward")
def multi_head_attention_forward(call: Call) -> list[Any]:
    """nn.MultiheadAttention in evaluation: projections, heads, attention (with the
    weights, averaged or per head, or through scaled_dot_product_attention), output
    projection; batched or unbatched; boolean or additive masks."""
    e = call.e
    p = {name: call.arg(i, name, default) for i, (name, default) in enumerate(_MHA_PARAMS)}
    out = call.out[0]
    if out.dtype not in (torch.float32, torch.float64):
        raise call.refuse(f"multi-head attention in {out.dtype}")
    for extra in ("bias_k", "bias_v", "static_k", "static_v"):
        if p[extra] is not None:
            raise call.refuse(f"multi-head attention with {extra}")
    if p["add_zero_attn"]:
        raise call.refuse("multi-head attention with add_zero_attn")
    if p["training"] and float(p["dropout_p"]) > 0.0:
        raise call.refuse("attention dropout in training mode")
    work = out.dtype
    query, key, value = (p[x] for x in ("query", "key", "value"))
    batched = query.rank == 3
    names = [operand(call, x, work) for x in (query, key, value)]
    padding = p["key_padding_mask"]
    if not batched:
        names = [e.op("Unsqueeze", [x, e.ints([1])]) for x in names]
    length, heads = query.shape[0], int(p["num_heads"])
    embed = query.shape[-1]
    source, head_dim = key.shape[0], embed // heads
    padding = _canonical_mask(call, padding, work)
    if padding is not None and not batched:
        padding = e.op("Unsqueeze", [padding, e.ints([0])])
    causal, need_weights = bool(p["is_causal"]), bool(p["need_weights"])
    if causal and padding is None and not need_weights:
        mask = None  # eager drops the mask and asks the kernel for causal attention
    else:
        mask = _canonical_mask(call, p["attn_mask"], work)
        if padding is not None:
            causal = False
    if mask is not None and example(p["attn_mask"]).dim() == 2:
        mask = e.op("Unsqueeze", [mask, e.ints([0])])
    q, k, v = _projections(call, p, names, embed, work)
    # the batch as -1 throughout: the same model, and one a batched fused model can stack
    # robots in
    q, k, v = (e.op("Transpose", [e.reshape(x, (n, -1, head_dim))], perm=[1, 0, 2])
               for x, n in ((q, length), (k, source), (v, source)))
    if padding is not None:  # [batch, source] -> [batch * heads, 1, source]
        padding = e.op("Expand", [e.reshape(padding, (-1, 1, 1, source)),
                                  e.ints([1, heads, 1, source])])
        padding = e.reshape(padding, (-1, 1, source))
        mask = padding if mask is None else e.op("Add", [mask, padding])
    weights = None
    if need_weights:
        scaled = e.op("Mul", [q, e.const(math.sqrt(1.0 / float(head_dim)), work)])
        scores = e.op("MatMul", [scaled, e.op("Transpose", [k], perm=[0, 2, 1])])
        if mask is not None:
            scores = e.op("Add", [mask, scores])
        weights = e.op("Softmax", [scores], axis=-1)
        attended = e.op("MatMul", [weights, v])
        weights = e.reshape(weights, (-1, heads, length, source))
        if p["average_attn_weights"]:
            weights = e.reduce("ReduceMean", weights, [1], False)
        if not batched:
            weights = e.op("Squeeze", [weights, e.ints([0])])
    else:
        attended = _sdpa(call, q, k, v, 3, length, source, 1.0 / math.sqrt(head_dim), work,
                         add_mask=mask, causal=causal)
    attended = e.reshape(e.op("Transpose", [attended], perm=[1, 0, 2]), (-1, embed))
    out_bias = p["out_proj_bias"]
    result = _linear(call, attended, operand(call, p["out_proj_weight"], work),
                     operand(call, out_bias, work) if out_bias is not None else None)
    result = e.reshape(result, (length, -1, embed) if batched else (length, embed))
    return [result, weights]
