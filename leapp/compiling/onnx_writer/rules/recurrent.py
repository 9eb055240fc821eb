"""Recurrent layers and cells: torch.gru / torch.lstm / torch.rnn_* (what
nn.GRU, nn.LSTM and nn.RNN call) and the *_cell functions, as ONNX GRU / LSTM /
RNN nodes, one per layer.  torch stores GRU gates as (r, z, n) and ONNX wants
(z, r, h), with the hidden weight applied before the reset gate
(linear_before_reset=1); LSTM gates go from (i, f, g, o) to (i, o, f, c).  The
weights must be constants (module parameters): they are reordered here."""
from __future__ import annotations

import torch

from ..emit import Call, Value, rule
from .common import finish, nan_flags, operand, opmath, sized_like

_ORDER = {"GRU": (1, 0, 2), "LSTM": (0, 3, 1, 2), "RNN": (0,)}


def _reorder(t: torch.Tensor, kind: str) -> torch.Tensor:
    order = _ORDER[kind]
    parts = torch.chunk(t, len(order), dim=0)
    return torch.cat([parts[i] for i in order], dim=0)


def _constant(call: Call, v: object) -> torch.Tensor:
    if not isinstance(v, Value) or not v.const:
        raise call.refuse("recurrent weights computed inside the node (not parameters)")
    return v.example.detach()


def _layer(call: Call, kind: str, x: str, length: int, weights: list[list[torch.Tensor]],
           hidden: int, h0: str, c0: str | None, work: torch.dtype, attrs: dict) -> list[str]:
    """One ONNX node over both directions, x [length, B, I]; (Y [T, D, B, H], Y_h, Y_c)."""
    e = call.e
    w = torch.stack([_reorder(d[0], kind) for d in weights]).to(work)
    r = torch.stack([_reorder(d[1], kind) for d in weights]).to(work)
    inputs = [x, e.tensor_const(w, "W"), e.tensor_const(r, "R")]
    if len(weights[0]) > 2:
        b = torch.stack([torch.cat([_reorder(d[2], kind), _reorder(d[3], kind)])
                         for d in weights]).to(work)
        inputs.append(e.tensor_const(b, "B"))
    else:
        inputs.append("")
    inputs += ["", h0]
    if kind == "LSTM":
        inputs.append(c0)
    direction = "bidirectional" if len(weights) == 2 else "forward"
    outputs = 3 if kind == "LSTM" else 2
    outs = e.op(kind, inputs, outputs=outputs, hidden_size=hidden, direction=direction,
                **attrs)
    return _keep_nan(call, x, length, h0, c0, outs, len(weights), work)


def _keep_nan(call: Call, x: str, length: int, h0: str, c0: str | None, outs: list[str],
              directions: int, work: torch.dtype) -> list[str]:
    """Eager's NaN through a recurrent layer, which onnxruntime's kernels turn into finite
    numbers.  A NaN anywhere in a robot's input at step t, or in its initial hidden
    state, reaches every gate through the weight products: its state is NaN from t on
    (back to the start in the reverse direction), or at every step.  A NaN in an LSTM's
    initial cell state stays in its element for the first step (the cell update is
    elementwise) and fills the row from the second."""
    e = call.e
    steps = e.reduce("ReduceMax", nan_flags(call, x, work), [2], False)  # [T, B]
    start = e.reduce("ReduceMax", nan_flags(call, h0, work), [2], False)  # [D, B]
    cell = nan_flags(call, c0, work) if c0 is not None else None  # [D, B, H]
    nan = e.const(float("nan"), work)
    zero = e.const(0.0, work)
    if length == 1:  # one step (a policy stepping once): its state is the last one
        row = e.op("Greater", [e.op("Add", [steps, start]), zero])  # [D, B]
        step_mask, last_mask = e.unsqueeze(row, [0, 3]), e.unsqueeze(row, [2])
        if cell is not None:
            own = e.op("Greater", [cell, zero])
            step_mask = e.op("Or", [step_mask, e.unsqueeze(own, [0])])
            last_mask = e.op("Or", [last_mask, own])
        masks = [step_mask] + [last_mask] * (len(outs) - 1)
        return [e.op("Where", [mask, nan, out]) for mask, out in zip(masks, outs)]
    if cell is not None:  # from the second step on, the cell's NaN fills the row
        later_start = e.op("Add", [start, e.reduce("ReduceMax", cell, [2], False)])
    else:
        later_start = start
    everywhere = e.reduce("ReduceMax", steps, [0], False)  # [B]
    seen, last, first = [], [], []
    for d in range(directions):
        so_far = e.op("CumSum", [steps, e.scalar_int(0)], reverse=d)
        initial = e.op("Gather", [start, e.scalar_int(d)], axis=0)  # [B]
        at_first = torch.zeros(length, 1, dtype=work)
        at_first[-1 if d else 0] = 1
        initial = e.op("Add", [e.op("Mul", [e.tensor_const(at_first), initial]),
                               e.op("Mul", [e.tensor_const(1 - at_first),
                                            e.op("Gather", [later_start, e.scalar_int(d)],
                                                 axis=0)])])  # [T, B]
        seen.append(e.unsqueeze(e.op("Add", [so_far, initial]), [1]))  # [T, 1, B]
        last.append(e.unsqueeze(e.op("Add", [everywhere, e.op(
            "Gather", [later_start, e.scalar_int(d)], axis=0)]), [0]))  # [1, B]
        if cell is not None:  # the cell's own NaN at the first step: [T, 1, B, H]
            first.append(e.unsqueeze(e.op("Mul", [
                e.tensor_const(at_first.reshape(length, 1, 1)),
                e.op("Gather", [cell, e.scalar_int(d)], axis=0)]), [1]))
    join = (lambda parts, axis: parts[0] if directions == 1  # noqa: E731
            else e.op("Concat", parts, axis=axis))
    step_mask = e.unsqueeze(e.op("Greater", [join(seen, 1), zero]), [3])  # [T, D, B, 1]
    last_mask = e.unsqueeze(e.op("Greater", [join(last, 0), zero]), [2])  # [D, B, 1]
    if cell is not None:
        step_mask = e.op("Or", [step_mask, e.op("Greater", [join(first, 1), zero])])
    masks = [step_mask] + [last_mask] * (len(outs) - 1)
    return [e.op("Where", [mask, nan, out]) for mask, out in zip(masks, outs)]


def _sequence(call: Call, kind: str, attrs: dict) -> list[str]:
    e = call.e
    x = call.args[0]
    state = call.args[1]
    params = call.args[2]
    if not isinstance(params, (list, tuple)):
        raise call.refuse("the packed-sequence form")
    has_biases, layers, _dropout, train, bidirectional, batch_first = call.args[3:9]
    if train:
        raise call.refuse("a recurrent layer in training mode")
    work = opmath(x.dtype)
    if work not in (torch.float32, torch.float64):
        raise call.refuse(f"a recurrent layer on {x.dtype}")
    if kind == "LSTM":
        h_state, c_state = state
    else:
        h_state, c_state = state, None
    per_layer = 4 if has_biases else 2
    directions = 2 if bidirectional else 1
    if len(params) != per_layer * layers * directions:
        raise call.refuse("projections (proj_size) or an unexpected weight list")
    weights = [_constant(call, p) for p in params]
    hidden = int(weights[1].shape[1])
    unbatched = x.rank == 2
    seq = operand(call, x, work)
    if unbatched:
        seq = e.unsqueeze(seq, [1])
    elif batch_first:
        seq = e.op("Transpose", [seq], perm=[1, 0, 2])
    # the zeros nn.GRU / nn.LSTM start from when given no state: the batch (axis 1 of
    # [layers, B, hidden] and of the [T, B, in] sequence) from the sequence (sized_like)
    data = None if unbatched else seq
    h_all = sized_like(call, h_state, work, data, [1])
    c_all = sized_like(call, c_state, work, data, [1]) if c_state is not None else None
    if unbatched:
        h_all = e.unsqueeze(h_all, [1])
        c_all = e.unsqueeze(c_all, [1]) if c_all is not None else None
    t_len = x.shape[0 if (unbatched or not batch_first) else 1]
    last_h, last_c = [], []
    for layer in range(layers):
        group = []
        for d in range(directions):
            start = (layer * directions + d) * per_layer
            group.append(weights[start:start + per_layer])
        lo, hi = layer * directions, (layer + 1) * directions
        h0 = e.slice(h_all, [lo], [hi], [0]) if layers * directions > 1 else h_all
        c0 = None
        if c_all is not None:
            c0 = e.slice(c_all, [lo], [hi], [0]) if layers * directions > 1 else c_all
        outs = _layer(call, kind, seq, t_len, group, hidden, h0, c0, work, attrs)
        y = outs[0]  # [T, D, B, H]
        if directions == 1:
            seq = e.squeeze(y, [1])
        else:
            batch = 1 if unbatched else x.shape[1 if not batch_first else 0]
            seq = e.reshape(e.op("Transpose", [y], perm=[0, 2, 1, 3]),
                            (t_len, batch, directions * hidden),
                            (t_len, batch, directions, hidden))
        last_h.append(outs[1])
        if kind == "LSTM":
            last_c.append(outs[2])
    out = seq
    if unbatched:
        out = e.squeeze(out, [1])
    elif batch_first:
        out = e.op("Transpose", [out], perm=[1, 0, 2])
    h_n = last_h[0] if len(last_h) == 1 else e.op("Concat", last_h, axis=0)
    if unbatched:
        h_n = e.squeeze(h_n, [1])
    results = [e.cast(out, work, x.dtype), e.cast(h_n, work, x.dtype)]
    if kind == "LSTM":
        c_n = last_c[0] if len(last_c) == 1 else e.op("Concat", last_c, axis=0)
        if unbatched:
            c_n = e.squeeze(c_n, [1])
        results.append(e.cast(c_n, work, x.dtype))
    return results


@rule("gru")
def gru(call: Call) -> list[str]:
    return _sequence(call, "GRU", {"linear_before_reset": 1})


@rule("lstm")
def lstm(call: Call) -> list[str]:
    return _sequence(call, "LSTM", {})


@rule("rnn_tanh")
def rnn_tanh(call: Call) -> list[str]:
    return _sequence(call, "RNN", {"activations": ["Tanh"] * (2 if call.args[7] else 1)})


@rule("rnn_relu")
def rnn_relu(call: Call) -> list[str]:
    return _sequence(call, "RNN", {"activations": ["Relu"] * (2 if call.args[7] else 1)})


def _cell(call: Call, kind: str, attrs: dict) -> object:
    e = call.e
    x = call.args[0]
    state = call.args[1]
    if kind == "LSTM":
        h, c = state
        params = call.args[2:6]
    else:
        h, c = state, None
        params = call.args[2:6]
    params = [p for p in params if p is not None]
    weights = [_constant(call, p) for p in params]
    work = opmath(x.dtype)
    if work not in (torch.float32, torch.float64):
        raise call.refuse(f"a recurrent cell on {x.dtype}")
    hidden = int(weights[1].shape[1])
    xv = operand(call, x, work)
    unbatched = x.rank == 1
    # the zeros nn.GRUCell starts from: the batch (axis 0 of [B, hidden]) from [B, in]
    data = None if unbatched else xv
    hv = sized_like(call, h, work, data, [0]) if h is not None else None
    cv = sized_like(call, c, work, data, [0]) if c is not None else None
    if unbatched:
        xv = e.unsqueeze(xv, [0])
    batch = 1 if unbatched else x.shape[0]
    if hv is None:
        hv = e.const(0.0, work, None)
        hv = e.op("Expand", [hv, e.ints((1, batch, hidden))])
    else:
        hv = e.unsqueeze(hv, [0] if not unbatched else [0, 1])
    if kind == "LSTM":
        cv = e.unsqueeze(cv, [0] if not unbatched else [0, 1])
    outs = _layer(call, kind, e.unsqueeze(xv, [0]), 1, [weights], hidden, hv, cv, work, attrs)
    axes = [0] if not unbatched else [0, 1]
    h_out = e.cast(e.squeeze(outs[1], axes), work, x.dtype)
    if kind == "LSTM":
        return [h_out, e.cast(e.squeeze(outs[2], axes), work, x.dtype)]
    return h_out


@rule("gru_cell")
def gru_cell(call: Call) -> object:
    return _cell(call, "GRU", {"linear_before_reset": 1})


@rule("lstm_cell")
def lstm_cell(call: Call) -> object:
    return _cell(call, "LSTM", {})


@rule("rnn_tanh_cell")
def rnn_tanh_cell(call: Call) -> object:
    return _cell(call, "RNN", {"activations": ["Tanh"]})


@rule("rnn_relu_cell")
def rnn_relu_cell(call: Call) -> object:
    return _cell(call, "RNN", {"activations": ["Relu"]})


_ = finish
