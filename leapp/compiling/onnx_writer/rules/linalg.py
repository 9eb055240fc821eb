"""Linear algebra and network layers: matmul family, linear (Gemm on 2-D inputs),
einsum, cross, normalisations (layer, batch in eval, group, F.normalize as
x / max(‖x‖, eps)), convolutions, pooling, nearest/linear interpolation and
embedding lookups.  Attention is in `attention`."""
from __future__ import annotations

from typing import Any

import torch

from ..emit import Call, Value, rule
from .common import finish, float_work, nan_kept, norm_dim, operand, opmath
from .reductions import vector_norm


@rule("matmul", "mm", "bmm", "operator.matmul", "__matmul__")
def matmul(call: Call) -> str:
    work = float_work(call)
    a = operand(call, call.args[0], work)
    b = operand(call, call.arg(1, "other", call.kwargs.get("mat2")), work)
    return finish(call, call.e.op("MatMul", [a, b]), work)


@rule("linear")
def linear(call: Call) -> str:
    e = call.e
    work = float_work(call)
    x = call.args[0]
    weight = call.arg(1, "weight")
    bias = call.arg(2, "bias")
    xv = operand(call, x, work)
    wv = operand(call, weight, work)
    bv = operand(call, bias, work) if bias is not None else None
    if x.rank == 2 and weight.rank == 2:
        inputs = [xv, wv] + ([bv] if bv is not None else [])
        return finish(call, e.op("Gemm", inputs, transB=1), work)
    if weight.rank == 2:
        product = e.op("MatMul", [xv, e.op("Transpose", [wv], perm=[1, 0])])
    else:
        product = e.op("MatMul", [xv, wv])
    if bv is not None:
        product = e.op("Add", [product, bv])
    return finish(call, product, work)


@rule("addmm")
def addmm(call: Call) -> str:
    e = call.e
    work = float_work(call)
    beta = call.kwargs.get("beta", 1)
    alpha = call.kwargs.get("alpha", 1)
    c = operand(call, call.args[0], work)
    a = operand(call, call.arg(1, "mat1"), work)
    b = operand(call, call.arg(2, "mat2"), work)
    return finish(call, e.op("Gemm", [a, b, c], alpha=float(alpha), beta=float(beta)), work)


@rule("outer", "ger")
def outer(call: Call) -> str:
    e = call.e
    work = opmath(call.out.dtype)
    a = e.unsqueeze(operand(call, call.args[0], work), [1])
    b = e.unsqueeze(operand(call, call.arg(1, "vec2"), work), [0])
    return finish(call, e.op("Mul", [a, b]), work)


@rule("dot", "inner", "vdot")
def dot(call: Call) -> str:
    e = call.e
    work = float_work(call)
    a = operand(call, call.args[0], work)
    b = operand(call, call.arg(1, "other"), work)
    if call.args[0].rank == 1:
        return finish(call, e.op("MatMul", [a, b]), work)
    raise call.refuse("inner of tensors above 1-D")


@rule("einsum")
def einsum(call: Call) -> str:
    equation = call.args[0]
    operands = list(call.args[1:])
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = list(operands[0])
    if not isinstance(equation, str) or not all(isinstance(o, Value) for o in operands):
        raise call.refuse("einsum with a sublist form")
    work = float_work(call)
    names = [operand(call, o, work) for o in operands]
    return finish(call, call.e.op("Einsum", names, equation=equation.replace(" ", "")), work)


@rule("cross")
def cross(call: Call) -> str:
    """a × b along dim (size 3): slices and products."""
    e = call.e
    a, b = call.args[0], call.arg(1, "other")
    work = opmath(call.out.dtype)
    rank = call.out.dim()
    dim = call.arg(2, "dim")
    if dim is None:
        dims = [d for d in range(rank) if call.out.shape[d] == 3]
        if not dims:
            raise call.refuse("no dimension of size 3")
        dim = dims[0]
    axis = norm_dim(int(dim), rank)
    av = e.op("Expand", [operand(call, a, work), e.ints(call.out.shape)])
    bv = e.op("Expand", [operand(call, b, work), e.ints(call.out.shape)])
    parts_a = e.op("Split", [av, e.ints([1, 1, 1])], outputs=3, axis=axis)
    parts_b = e.op("Split", [bv, e.ints([1, 1, 1])], outputs=3, axis=axis)

    def term(i: int, j: int) -> str:
        return e.op("Sub", [e.op("Mul", [parts_a[i], parts_b[j]]),
                            e.op("Mul", [parts_a[j], parts_b[i]])])
    return finish(call, e.op("Concat", [term(1, 2), term(2, 0), term(0, 1)], axis=axis), work)




@rule("layer_norm")
def layer_norm(call: Call) -> str:
    e = call.e
    work = float_work(call)
    x = call.args[0]
    shape = call.arg(1, "normalized_shape")
    shape = [shape] if isinstance(shape, int) else list(shape)
    weight, bias = call.arg(2, "weight"), call.arg(3, "bias")
    eps = float(call.arg(4, "eps", 1e-5))
    axis = x.rank - len(shape)
    xv = operand(call, x, work)
    w = operand(call, weight, work) if weight is not None else e.const(1.0, work, None)
    if weight is None:
        w = e.op("Expand", [w, e.ints(shape)])
    if call.opset >= 17:
        inputs = [xv, w] + ([operand(call, bias, work)] if bias is not None else [])
        return finish(call, e.op("LayerNormalization", inputs, axis=axis, epsilon=eps), work)
    axes = list(range(axis, x.rank))
    mean = e.reduce("ReduceMean", xv, axes, True)
    centred = e.op("Sub", [xv, mean])
    var = e.reduce("ReduceMean", e.op("Mul", [centred, centred]), axes, True)
    normed = e.op("Div", [centred, e.op("Sqrt", [e.op("Add", [var, e.const(eps, work)])])])
    normed = e.op("Mul", [normed, w])
    if bias is not None:
        normed = e.op("Add", [normed, operand(call, bias, work)])
    return finish(call, normed, work)


@rule("batch_norm")
def batch_norm(call: Call) -> str:
    e = call.e
    work = float_work(call)
    x = call.args[0]
    mean, var = call.arg(1, "running_mean"), call.arg(2, "running_var")
    weight, bias = call.arg(3, "weight"), call.arg(4, "bias")
    training = call.arg(5, "training", False)
    eps = float(call.arg(7, "eps", 1e-5))
    if training or mean is None or var is None:
        raise call.refuse("batch_norm with batch statistics (training mode)")
    channels = x.shape[1]
    scale = operand(call, weight, work) if weight is not None else \
        e.const([1.0] * channels, work)
    shift = operand(call, bias, work) if bias is not None else e.const([0.0] * channels, work)
    inputs = [operand(call, x, work), scale, shift, operand(call, mean, work),
              operand(call, var, work)]
    name = e.op("BatchNormalization", inputs, epsilon=eps, training_mode=0)
    return finish(call, name, work)


@rule("group_norm")
def group_norm(call: Call) -> str:
    e = call.e
    work = float_work(call)
    x = call.args[0]
    groups = int(call.arg(1, "num_groups"))
    weight, bias = call.arg(2, "weight"), call.arg(3, "bias")
    eps = float(call.arg(4, "eps", 1e-5))
    n, c = x.shape[0], x.shape[1]
    xv = e.reshape(operand(call, x, work), (n, groups, -1), x.shape)
    mean = e.reduce("ReduceMean", xv, [2], True)
    centred = e.op("Sub", [xv, mean])
    var = e.reduce("ReduceMean", e.op("Mul", [centred, centred]), [2], True)
    normed = e.op("Div", [centred, e.op("Sqrt", [e.op("Add", [var, e.const(eps, work)])])])
    normed = e.reshape(normed, x.shape, (n, groups, -1))
    affine_shape = (c,) + (1,) * (x.rank - 2)
    if weight is not None:
        normed = e.op("Mul", [normed, e.reshape(operand(call, weight, work), affine_shape)])
    if bias is not None:
        normed = e.op("Add", [normed, e.reshape(operand(call, bias, work), affine_shape)])
    return finish(call, normed, work)


@rule("normalize")
def normalize(call: Call) -> str:
    e = call.e
    work = float_work(call)
    x = call.args[0]
    p = float(call.arg(1, "p", 2.0))
    dim = norm_dim(int(call.arg(2, "dim", 1)), x.rank)
    eps = float(call.arg(3, "eps", 1e-12))
    norm = vector_norm(call, x, p, [dim], True, work)
    denominator = e.op("Max", [norm, e.const(eps, work)])
    return finish(call, e.op("Div", [operand(call, x, work), denominator]), work)


def _tuple(value: object, n: int) -> list[int]:
    if isinstance(value, (list, tuple)):
        values = [int(v) for v in value]
        return values * n if len(values) == 1 else values
    return [int(value)] * n


def _conv(call: Call, n: int, transposed: bool) -> str:
    e = call.e
    work = float_work(call)
    x, weight = call.args[0], call.arg(1, "weight")
    bias = call.arg(2, "bias")
    stride = _tuple(call.arg(3, "stride", 1), n)
    if transposed:
        padding = call.arg(4, "padding", 0)
        output_padding = _tuple(call.arg(5, "output_padding", 0), n)
        groups = int(call.arg(6, "groups", 1))
        dilation = _tuple(call.arg(7, "dilation", 1), n)
    else:
        padding = call.arg(4, "padding", 0)
        dilation = _tuple(call.arg(5, "dilation", 1), n)
        groups = int(call.arg(6, "groups", 1))
        output_padding = None
    kernel = list(weight.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            pads = [0] * (2 * n)
        else:  # "same": eager pads total = d·(k - 1), the extra one at the end
            total = [d * (k - 1) for d, k in zip(dilation, kernel)]
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
    else:
        pad = _tuple(padding, n)
        pads = pad + pad
    unbatched = x.rank == n + 1
    xv = operand(call, x, work)
    if unbatched:
        xv = e.unsqueeze(xv, [0])
    inputs = [xv, operand(call, weight, work)] + \
        ([operand(call, bias, work)] if bias is not None else [])
    attrs = dict(strides=stride, pads=pads, dilations=dilation, group=groups,
                 kernel_shape=kernel)
    if transposed:
        name = e.op("ConvTranspose", inputs, output_padding=output_padding, **attrs)
    else:
        name = e.op("Conv", inputs, **attrs)
    if unbatched:
        name = e.squeeze(name, [0])
    return finish(call, name, work)


rule("conv1d")(lambda call: _conv(call, 1, False))
rule("conv2d")(lambda call: _conv(call, 2, False))
rule("conv3d")(lambda call: _conv(call, 3, False))
rule("conv_transpose1d")(lambda call: _conv(call, 1, True))
rule("conv_transpose2d")(lambda call: _conv(call, 2, True))
rule("conv_transpose3d")(lambda call: _conv(call, 3, True))


def _max_pool(call: Call, x: str, work: torch.dtype, op_type: str, **attrs: Any) -> str:
    """MaxPool / GlobalMaxPool with eager's NaN (common.nan_kept)."""
    return nan_kept(call, x, work, lambda t: call.e.op(op_type, [t], **attrs))


def _pool(call: Call, n: int, op_type: str) -> str:
    e = call.e
    work = float_work(call)
    x = call.args[0]
    kernel = _tuple(call.arg(1, "kernel_size"), n)
    stride = call.arg(2, "stride")
    stride = kernel if stride is None or stride == [] or stride == () else _tuple(stride, n)
    pad = _tuple(call.arg(3, "padding", 0), n)
    if op_type == "MaxPool":
        dilation = _tuple(call.arg(4, "dilation", 1), n)
        ceil_mode = bool(call.arg(5, "ceil_mode", False))
        if call.arg(6, "return_indices", False):
            raise call.refuse("max pooling with indices")
        attrs = dict(dilations=dilation)
    else:
        ceil_mode = bool(call.arg(4, "ceil_mode", False))
        include = bool(call.arg(5, "count_include_pad", True))
        if n > 1 and call.arg(6, "divisor_override") is not None:
            raise call.refuse("divisor_override")
        attrs = dict(count_include_pad=int(include))
    unbatched = x.rank == n + 1
    xv = operand(call, x, work)
    if unbatched:
        xv = e.unsqueeze(xv, [0])
    attrs.update(kernel_shape=kernel, strides=stride, pads=pad + pad, ceil_mode=int(ceil_mode))
    if op_type == "MaxPool":
        name = _max_pool(call, xv, work, "MaxPool", **attrs)
    else:
        name = e.op(op_type, [xv], **attrs)
    if unbatched:
        name = e.squeeze(name, [0])
    return finish(call, name, work)


rule("max_pool1d")(lambda call: _pool(call, 1, "MaxPool"))
rule("max_pool2d")(lambda call: _pool(call, 2, "MaxPool"))
rule("max_pool3d")(lambda call: _pool(call, 3, "MaxPool"))
rule("avg_pool1d")(lambda call: _pool(call, 1, "AveragePool"))
rule("avg_pool2d")(lambda call: _pool(call, 2, "AveragePool"))
rule("avg_pool3d")(lambda call: _pool(call, 3, "AveragePool"))


def _windows(size: int, out: int) -> list[tuple[int, int]]:
    """Adaptive pooling's window of each output index: [floor(i*size/out),
    ceil((i+1)*size/out)) (overlapping where out does not divide size)."""
    return [(i * size // out, -(-(i + 1) * size // out)) for i in range(out)]


def _window_counts(size: list[int], out: list[int]) -> torch.Tensor:
    """Elements in each output's window, shape out."""
    counts = torch.ones(out, dtype=torch.float64)
    for k, (s, o) in enumerate(zip(size, out)):
        widths = torch.tensor([hi - lo for lo, hi in _windows(s, o)], dtype=torch.float64)
        counts = counts * widths.reshape([o if j == k else 1 for j in range(len(out))])
    return counts


def _adaptive_windows(call: Call, x: str, size: list[int], out: list[int],
                      reduce_op: str) -> str:
    """Each window reduced axis by axis (a sum or a max over a box is one over each of
    its axes in turn), the outputs of an axis concatenated."""
    e = call.e
    rank = len(size) + 2
    for k, (s, o) in enumerate(zip(size, out)):
        axis = rank - len(size) + k
        parts = [e.reduce(reduce_op, e.op("Slice", [x, e.ints([lo]), e.ints([hi]),
                                                    e.ints([axis])]), [axis], True)
                 for lo, hi in _windows(s, o)]
        x = e.op("Concat", parts, axis=axis) if len(parts) > 1 else parts[0]
    return x


def _adaptive(call: Call, n: int, op_type: str) -> str:
    e = call.e
    work = float_work(call)
    x = call.args[0]
    size = list(x.shape[-n:])
    out = list(call.out.shape[-n:])
    xv = operand(call, x, work)
    unbatched = x.rank == n + 1
    if unbatched:
        xv = e.unsqueeze(xv, [0])
    if out == [1] * n and op_type == "MaxPool":
        name = _max_pool(call, xv, work, "GlobalMaxPool")
    elif out == [1] * n:
        name = e.op("Global" + op_type, [xv])
    elif all(s % o == 0 for s, o in zip(size, out)):
        kernel = [s // o for s, o in zip(size, out)]
        if op_type == "MaxPool":
            name = _max_pool(call, xv, work, op_type, kernel_shape=kernel, strides=kernel)
        else:
            name = e.op(op_type, [xv], kernel_shape=kernel, strides=kernel)
    else:
        if op_type == "AveragePool":
            name = e.op("Div", [_adaptive_windows(call, xv, size, out, "ReduceSum"),
                                e.tensor_const(_window_counts(size, out).to(work))])
        else:
            name = nan_kept(call, xv, work,
                            lambda t: _adaptive_windows(call, t, size, out, "ReduceMax"))
    if unbatched:
        name = e.squeeze(name, [0])
    return finish(call, name, work)


rule("adaptive_avg_pool1d")(lambda call: _adaptive(call, 1, "AveragePool"))
rule("adaptive_avg_pool2d")(lambda call: _adaptive(call, 2, "AveragePool"))
rule("adaptive_avg_pool3d")(lambda call: _adaptive(call, 3, "AveragePool"))


@rule("adaptive_max_pool2d", "adaptive_max_pool1d")
def adaptive_max(call: Call) -> str:
    if call.arg(2, "return_indices", False):
        raise call.refuse("adaptive max pooling with indices")
    n = 2 if "2d" in str(getattr(call.node.target, "__name__", "")) else 1
    return _adaptive(call, n, "MaxPool")


@rule("interpolate", "upsample")
def interpolate(call: Call) -> str:
    e = call.e
    work = float_work(call)
    x = call.args[0]
    mode = call.kwargs.get("mode", call.args[3] if len(call.args) > 3 else "nearest")
    align = call.kwargs.get("align_corners")
    if call.kwargs.get("antialias"):
        raise call.refuse("antialias")
    spatial = x.rank - 2
    sizes = list(call.out.shape)
    if mode == "nearest":
        attrs = dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                     nearest_mode="floor")
        scale = call.kwargs.get("scale_factor", call.args[2] if len(call.args) > 2 else None)
        recompute = call.kwargs.get("recompute_scale_factor")
        if scale is not None and not recompute:
            scales = [1.0, 1.0] + [float(s) for s in _tuple_f(scale, spatial)]
            xv = operand(call, x, work)
            return finish(call, e.op("Resize", [xv, "", e.const(scales, torch.float32)],
                                     **attrs), work)
    elif mode in ("linear", "bilinear", "trilinear"):
        attrs = dict(mode="linear", coordinate_transformation_mode="align_corners" if align
                     else "pytorch_half_pixel")
        if call.kwargs.get("scale_factor") is not None and not align \
                and not call.kwargs.get("recompute_scale_factor"):
            raise call.refuse("linear interpolation by scale factor")
    else:
        raise call.refuse(f"mode={mode!r}")
    xv = operand(call, x, work)
    return finish(call, e.op("Resize", [xv, "", "", e.ints(sizes)], **attrs), work)


def _tuple_f(value: object, n: int) -> list[float]:
    if isinstance(value, (list, tuple)):
        return [float(v) for v in value]
    return [float(value)] * n


@rule("embedding")
def embedding(call: Call) -> str:
    e = call.e
    index, weight = call.args[0], call.arg(1, "weight")
    if call.kwargs.get("max_norm") is not None:
        raise call.refuse("embedding with max_norm")
    idx = e.cast(index.name, index.dtype, torch.int64)
    return e.op("Gather", [weight.name if isinstance(weight, Value) else
                           e.tensor_const(weight), idx], axis=0)
