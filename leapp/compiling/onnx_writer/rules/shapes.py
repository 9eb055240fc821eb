"""Shapes, views and indexing: every view writes eager's result shape (Reshape /
Expand to the traced shape, never -1; the leading dimensions a reshape keeps
from its input as 0, and an expand to an input's whole shape as that input's
Shape, both copied at run time), permutations as Transpose,
basic indexing as Slice / Gather / Unsqueeze, a tensor index as Gather, keys
mixing tensor indices computed from the inputs with other parts as eager indexes
(rules.indexing), any other constant key as one Gather of the flat positions it
selects, diagonals as Gather of constant positions.  Values chosen by index
tensors and masks, and the in-place writes the tracer records, are rules.selection."""
from __future__ import annotations

from typing import Any

import torch

from ..emit import Call, Value, rule
from .common import choose, norm_dim, operand, rule_name, sized_like
from .indexing import advanced
from .selection import index_operand

_BIG = 2 ** 63 - 1


def _shape_tail(call: Call) -> tuple:
    args = call.args[1:]
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


@rule("view", "reshape", "view_as", "reshape_as", "flatten", "unflatten", "ravel", "squeeze",
      "unsqueeze", "atleast_1d", "atleast_2d", "atleast_3d", "squeeze_copy", "unsqueeze_copy",
      "view_copy", "_unsafe_view")
def reshape(call: Call) -> str:
    x = call.args[0]
    if not isinstance(x, Value):
        raise call.refuse("a non-tensor input")
    if any(isinstance(a, torch.dtype) for a in call.args[1:]) or \
            isinstance(call.kwargs.get("dtype"), torch.dtype):
        raise call.refuse("a view as another dtype (a bit cast)")
    if tuple(call.out.shape) == x.shape:
        return call.e.op("Identity", [x.name])
    # (un)squeezing names its axes: Unsqueeze / Squeeze keep every other axis open,
    # where a Reshape's target could only copy the axes before the new one
    name = rule_name(call)
    if name in ("unsqueeze", "unsqueeze_copy"):
        return call.e.unsqueeze(x.name, [norm_dim(int(call.arg(1, "dim")), x.rank + 1)])
    if name in ("squeeze", "squeeze_copy"):
        dims = call.arg(1, "dim")
        dims = range(x.rank) if dims is None else [dims] if isinstance(dims, int) else dims
        axes = sorted({norm_dim(int(d), x.rank) for d in dims} & {a for a, size in
                                                                  enumerate(x.shape) if size == 1})
        return call.e.squeeze(x.name, axes)
    return call.e.reshape(x.name, tuple(call.out.shape), x.shape)


@rule("expand", "expand_as", "broadcast_to", "expand_copy")
def expand(call: Call) -> str:
    x = call.args[0]
    if tuple(call.out.shape) == x.shape:
        return call.e.op("Identity", [x.name])
    return call.e.op("Expand", [x.name, call.e.ints(call.out.shape)])


def transpose_perm(call: Call, x: Value, perm: list[int]) -> str:
    if perm == list(range(x.rank)):
        return call.e.op("Identity", [x.name])
    return call.e.op("Transpose", [x.name], perm=perm)


@rule("permute", "permute_copy")
def permute(call: Call) -> str:
    x = call.args[0]
    dims = _shape_tail(call) or tuple(call.kwargs.get("dims", ()))
    return transpose_perm(call, x, [norm_dim(int(d), x.rank) for d in dims])


@rule("transpose", "swapaxes", "swapdims", "transpose_copy")
def transpose(call: Call) -> str:
    x = call.args[0]
    if x.rank < 2:
        return call.e.op("Identity", [x.name])
    a = norm_dim(int(call.arg(1, "dim0")), x.rank)
    b = norm_dim(int(call.arg(2, "dim1")), x.rank)
    perm = list(range(x.rank))
    perm[a], perm[b] = perm[b], perm[a]
    return transpose_perm(call, x, perm)


@rule("t", "adjoint")
def t(call: Call) -> str:
    x = call.args[0]
    if x.rank < 2:
        return call.e.op("Identity", [x.name])
    perm = list(range(x.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return transpose_perm(call, x, perm)


@rule("reverse_dims")
def reverse_dims(call: Call) -> str:
    x = call.args[0]
    return transpose_perm(call, x, list(reversed(range(x.rank))))


@rule("movedim", "moveaxis")
def movedim(call: Call) -> str:
    x = call.args[0]
    src, dst = call.arg(1, "source"), call.arg(2, "destination")
    src = [src] if isinstance(src, int) else list(src)
    dst = [dst] if isinstance(dst, int) else list(dst)
    src = [norm_dim(s, x.rank) for s in src]
    dst = [norm_dim(d, x.rank) for d in dst]
    perm: list[int | None] = [None] * x.rank
    for s, d in zip(src, dst):
        perm[d] = s
    rest = iter(d for d in range(x.rank) if d not in src)
    return transpose_perm(call, x, [p if p is not None else next(rest) for p in perm])


@rule("contiguous", "clone", "detach", "alias", "cpu", "requires_grad_", "detach_",
      "resolve_conj", "resolve_neg", "lift_fresh")
def identity(call: Call) -> Any:
    x = call.args[0]
    if not isinstance(x, Value):
        raise call.refuse("a non-tensor input")
    return x


@rule("repeat", "tile")
def repeat(call: Call) -> str:
    e = call.e
    x = call.args[0]
    reps = _shape_tail(call) or tuple(call.kwargs.get("dims", call.kwargs.get("repeats", ())))
    reps = [int(r) for r in reps]
    name = x.name
    if len(reps) < x.rank:  # tile pads its repeats on the left
        reps = [1] * (x.rank - len(reps)) + reps
    if len(reps) > x.rank:
        name = e.reshape(name, (1,) * (len(reps) - x.rank) + x.shape)
    return e.op("Tile", [name, e.ints(reps)])


@rule("flip")
def flip(call: Call) -> str:
    x = call.args[0]
    dims = list(call.args[1:]) if len(call.args) > 2 else call.arg(1, "dims")
    dims = [dims] if isinstance(dims, int) else list(dims)
    axes = sorted({norm_dim(int(d), x.rank) for d in dims})
    if not axes:
        return call.e.op("Identity", [x.name])
    return call.e.slice(x.name, [-1] * len(axes), [-_BIG - 1] * len(axes), axes,
                        [-1] * len(axes))


@rule("fliplr")
def fliplr(call: Call) -> str:
    x = call.args[0]
    return call.e.slice(x.name, [-1], [-_BIG - 1], [1], [-1])


@rule("flipud")
def flipud(call: Call) -> str:
    x = call.args[0]
    return call.e.slice(x.name, [-1], [-_BIG - 1], [0], [-1])


@rule("roll")
def roll(call: Call) -> str:
    e = call.e
    x = call.args[0]
    shifts = call.arg(1, "shifts")
    dims = call.arg(2, "dims")
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    name, shape = x.name, x.shape
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        name, shape = e.reshape(name, (-1,)), (x.example.numel(),)
        dims = [0]
    dims = [dims] if isinstance(dims, int) else list(dims)
    for shift, dim in zip(shifts, dims):
        axis = norm_dim(int(dim), len(shape))
        n = shape[axis]
        s = int(shift) % n if n else 0
        if s == 0:
            continue
        tail = e.slice(name, [n - s], [n], [axis])
        head = e.slice(name, [0], [n - s], [axis])
        name = e.op("Concat", [tail, head], axis=axis)
    if shape != x.shape:
        name = e.reshape(name, x.shape, shape)
    return name if name != x.name else e.op("Identity", [x.name])


@rule("cat", "concat", "concatenate")
def cat(call: Call) -> str:
    e = call.e
    tensors = list(call.arg(0, "tensors"))
    dim = call.arg(1, "dim", call.kwargs.get("axis", 0))
    out = call.out
    keep = [t for t in tensors if not (isinstance(t, Value) and t.rank == 1
                                       and t.shape[0] == 0 and out.dim() != 1)]
    if any(not isinstance(t, Value) for t in keep):
        raise call.refuse("a non-tensor in the list")
    axis = norm_dim(int(dim), out.dim())
    data = next((t.name for t in keep if not t.const), None)
    others = [a for a in range(out.dim()) if a != axis]
    names = [sized_like(call, t, out.dtype, data, others) for t in keep]
    if len(names) == 1:
        return e.op("Identity", names)
    return e.op("Concat", names, axis=axis)


@rule("stack")
def stack(call: Call) -> str:
    e = call.e
    tensors = list(call.arg(0, "tensors"))
    out = call.out
    axis = norm_dim(int(call.arg(1, "dim", 0)), out.dim())
    names = [e.unsqueeze(operand(call, t, out.dtype), [axis]) for t in tensors]
    if len(names) == 1:
        return e.op("Identity", names)
    return e.op("Concat", names, axis=axis)


def _split_like_out(call: Call, x: Value, dim: int, squeeze: bool = False) -> list[str]:
    e = call.e
    outs = list(call.out)
    axis = norm_dim(int(dim), x.rank)
    if squeeze:
        sizes = [1] * len(outs)
    else:
        sizes = [int(o.shape[axis]) for o in outs]
    if sum(sizes) != x.shape[axis]:
        raise call.refuse("parts that do not cover the dimension")
    if len(outs) == 1:
        parts = [e.op("Identity", [x.name])]
    else:
        parts = e.op("Split", [x.name, e.ints(sizes)], outputs=len(outs), axis=axis)
    if squeeze:
        parts = [e.squeeze(p, [axis]) for p in parts]
    return parts


@rule("split", "split_with_sizes")
def split(call: Call) -> list[str]:
    return _split_like_out(call, call.args[0], call.arg(2, "dim", 0))


@rule("chunk")
def chunk(call: Call) -> list[str]:
    return _split_like_out(call, call.args[0], call.arg(2, "dim", 0))


@rule("tensor_split")
def tensor_split(call: Call) -> list[str]:
    return _split_like_out(call, call.args[0], call.arg(2, "dim", 0))


@rule("unbind")
def unbind(call: Call) -> list[str]:
    return _split_like_out(call, call.args[0], call.arg(1, "dim", 0), squeeze=True)


@rule("narrow")
def narrow(call: Call) -> str:
    x = call.args[0]
    dim = norm_dim(int(call.arg(1, "dim")), x.rank)
    start = call.arg(2, "start")
    length = int(call.arg(3, "length"))
    if isinstance(start, Value):
        raise call.refuse("a tensor start")
    start = int(start) % x.shape[dim] if int(start) < 0 else int(start)
    return call.e.slice(x.name, [start], [start + length], [dim])


@rule("slice")
def slice_(call: Call) -> str:
    """aten.slice(x, dim, start, end, step): x[..., start:end:step] along dim (what
    TorchScript records for basic slicing)."""
    x = call.args[0]
    if not isinstance(x, Value) or x.rank == 0:
        raise call.refuse("a non-tensor or 0-d input")
    dim = norm_dim(int(call.arg(1, "dim", 0)), x.rank)
    bounds = [call.arg(2, "start"), call.arg(3, "end"), call.arg(4, "step", 1)]
    if any(isinstance(b, Value) for b in bounds):
        raise call.refuse("a tensor bound")
    start, end, step = (None if b is None else int(b) for b in bounds)
    if step is None or step <= 0:
        raise call.refuse(f"step {step}")
    # Python's clamping of the bounds is eager's (an end past the size is the size)
    kept = range(x.shape[dim])[slice(start, end, step)]
    if len(kept) == x.shape[dim]:
        return call.e.op("Identity", [x.name])
    return call.e.slice(x.name, [kept.start], [kept.stop], [dim], [step])


@rule("select")
def select(call: Call) -> str:
    x = call.args[0]
    dim = norm_dim(int(call.arg(1, "dim")), x.rank)
    index = call.arg(2, "index")
    return call.e.op("Gather", [x.name, call.e.scalar_int(int(index))], axis=dim)


@rule("tril", "triu")
def trilu(call: Call) -> str:
    x = call.args[0]
    k = int(call.arg(1, "diagonal", 0))
    upper = 1 if rule_name(call) == "triu" else 0
    return call.e.op("Trilu", [x.name, call.e.scalar_int(k)], upper=upper)


# ---------------------------------------------------------------------------
# diagonals: static positions, so a Gather of constant indices (and a Where with a
# constant mask to build a diagonal matrix: NaN and inf off the diagonal stay out)


def diagonal_of(call: Call, x: Value, offset: int, dim1: int, dim2: int) -> str:
    """x's diagonal (offset above dim1 -> dim2) as a new last dim, the others in order."""
    e = call.e
    d1, d2 = norm_dim(int(dim1), x.rank), norm_dim(int(dim2), x.rank)
    if d1 == d2:
        raise call.refuse("dim1 == dim2")
    rows, cols = x.shape[d1], x.shape[d2]
    others = [d for d in range(x.rank) if d not in (d1, d2)]
    perm = others + [d1, d2]
    name = x.name if perm == list(range(x.rank)) else e.op("Transpose", [x.name], perm=perm)
    flat = e.reshape(name, tuple(x.shape[d] for d in others) + (rows * cols,))
    if offset >= 0:
        positions = [r * cols + r + offset for r in range(max(0, min(rows, cols - offset)))]
    else:
        positions = [(c - offset) * cols + c for c in range(max(0, min(rows + offset, cols)))]
    index = e.tensor_const(torch.tensor(positions, dtype=torch.int64))
    return e.op("Gather", [flat, index], axis=len(others))


def embed_diagonal(call: Call, x: Value, offset: int, dim1: int, dim2: int) -> str:
    """x's last dim put on the diagonal (offset) of two new dims dim1, dim2 of the
    result, zeros elsewhere; the other dims of x in order."""
    e = call.e
    if x.rank == 0:
        raise call.refuse("a 0-dim tensor")
    size = x.shape[-1] + abs(offset)
    rank = x.rank + 1
    d1, d2 = norm_dim(int(dim1), rank), norm_dim(int(dim2), rank)
    if d1 == d2:
        raise call.refuse("dim1 == dim2")
    rows = torch.arange(size).view(size, 1)
    cols = torch.arange(size).view(1, size)
    on = (cols - rows) == offset
    source = torch.where(on, rows if offset >= 0 else cols, torch.zeros((), dtype=torch.int64))
    picked = e.op("Gather", [x.name, e.tensor_const(source)], axis=x.rank - 1)
    zero = e.const(False if x.dtype == torch.bool else 0, x.dtype)
    matrix = choose(call, e.tensor_const(on), picked, zero, x.dtype)
    perm = [0] * rank
    rest = iter(range(rank - 2))
    for axis in range(rank):
        perm[axis] = rank - 2 if axis == d1 else rank - 1 if axis == d2 else next(rest)
    if perm == list(range(rank)):
        return matrix
    return e.op("Transpose", [matrix], perm=perm)


@rule("diagonal")
def diagonal(call: Call) -> str:
    x = call.args[0]
    if not isinstance(x, Value) or x.rank < 2:
        raise call.refuse("a tensor of fewer than 2 dims")
    return diagonal_of(call, x, int(call.arg(1, "offset", 0)), int(call.arg(2, "dim1", 0)),
                       int(call.arg(3, "dim2", 1)))


@rule("diag_embed")
def diag_embed(call: Call) -> str:
    x = call.args[0]
    if not isinstance(x, Value):
        raise call.refuse("a non-tensor input")
    return embed_diagonal(call, x, int(call.arg(1, "offset", 0)), int(call.arg(2, "dim1", -2)),
                          int(call.arg(3, "dim2", -1)))


@rule("diag")
def diag(call: Call) -> str:
    """A vector on the diagonal of a square matrix, or a matrix's diagonal."""
    x = call.args[0]
    offset = int(call.arg(1, "diagonal", 0))
    if not isinstance(x, Value) or x.rank not in (1, 2):
        raise call.refuse("a tensor of other than 1 or 2 dims")
    if x.rank == 1:
        return embed_diagonal(call, x, offset, 0, 1)
    return diagonal_of(call, x, offset, 0, 1)


@rule("diagflat")
def diagflat(call: Call) -> str:
    x = call.args[0]
    if not isinstance(x, Value):
        raise call.refuse("a non-tensor input")
    flat = Value(call.e.reshape(x.name, (x.example.numel(),)), x.example.reshape(-1))
    return embed_diagonal(call, flat, int(call.arg(1, "offset", 0)), 0, 1)

# ---------------------------------------------------------------------------
# x[key]


def _expand_key(key: Any, rank: int) -> list | None:
    items = list(key) if isinstance(key, tuple) else [key]
    consumed = 0
    for item in items:
        if item is None or item is Ellipsis:
            continue
        if isinstance(item, Value) and item.dtype in (torch.bool, torch.uint8):
            consumed += item.rank  # a mask covers as many dims as it has
        else:
            consumed += 1
    if consumed > rank:
        return None
    if Ellipsis in [i for i in items if not isinstance(i, Value)]:
        at = next(i for i, item in enumerate(items)
                  if not isinstance(item, Value) and item is Ellipsis)
        items = items[:at] + [slice(None)] * (rank - consumed) + items[at + 1:]
    else:
        items = items + [slice(None)] * (rank - consumed)
    return items


def _basic(call: Call, x: Value, items: list) -> str | None:
    """ints, slices, None and at most one integer tensor index (with no ints)."""
    e = call.e
    tensors = [i for i in items if isinstance(i, Value)]
    ints = [i for i in items if isinstance(i, int) and not isinstance(i, bool)]
    if any(isinstance(i, (bool, list, torch.Tensor)) for i in items):
        return None
    if len(tensors) > 1 or (tensors and ints) or \
            (tensors and tensors[0].dtype in (torch.bool, torch.uint8)):
        return None
    name = x.name
    starts, ends, axes, steps = [], [], [], []
    axis = 0
    int_axes = []
    tensor_axis = None
    for item in items:
        if item is None:
            continue
        if isinstance(item, slice):
            start, stop, step = item.start, item.stop, item.step
            if any(isinstance(v, Value) for v in (start, stop, step)):
                return None
            step = 1 if step is None else int(step)
            if step <= 0:
                return None
            if (start in (None, 0)) and stop is None and step == 1:
                axis += 1
                continue
            starts.append(0 if start is None else int(start))
            ends.append(_BIG if stop is None else int(stop))
            axes.append(axis)
            steps.append(step)
        elif isinstance(item, int):
            int_axes.append((axis, item))
        else:
            tensor_axis = axis
        axis += 1
    if axes:
        name = e.slice(name, starts, ends, axes, steps)
    for at, index in sorted(int_axes, reverse=True):
        size = x.shape[at]
        if not -size <= index < size:
            return None
        name = e.op("Gather", [name, e.scalar_int(index)], axis=at)
    if tensor_axis is not None:
        name = e.op("Gather", [name, index_operand(call, tensors[0])], axis=tensor_axis)
    news = []
    position = 0
    for item in items:
        if item is None:
            news.append(position)
            position += 1
        elif isinstance(item, slice):
            position += 1
        elif isinstance(item, Value):
            position += item.rank
    if news:
        name = e.unsqueeze(name, news)
    if name == x.name:
        name = e.op("Identity", [name])
    return name


@rule("operator.getitem", "__getitem__")
def getitem(call: Call) -> str:
    x, key = call.args[0], call.args[1]
    if not isinstance(x, Value):
        raise call.refuse("indexing a non-tensor")
    return _keyed(call, x, key, call.example_args[1])


@rule("index")
def index(call: Call) -> str:
    """aten.index(x, [i0, None, i2, ...]) (TorchScript's advanced indexing): x[i0, :, i2]."""
    x, indices = call.args[0], call.arg(1, "indices")
    example = call.example_args[1] if len(call.example_args) > 1 else \
        call.example_kwargs.get("indices")
    if not isinstance(x, Value) or not isinstance(indices, (list, tuple)):
        raise call.refuse("indexing a non-tensor or indices that are not a list")
    return _keyed(call, x, tuple(slice(None) if i is None else i for i in indices),
                  tuple(slice(None) if i is None else i for i in example), aten=True)


def _keyed(call: Call, x: Value, key: Any, example_key: Any, aten: bool = False) -> str:
    """x[key] (aten: aten.index(x, key), where a 0-dim index broadcasts rather than
    selects); example_key is the key with eager's tensors."""
    items = _expand_key(key, x.rank)
    if items is not None:
        before = len(call.e.nodes)
        name = _basic(call, x, items)
        if name is not None:
            return name
        del call.e.nodes[before:]
    if _traced_parts(key):  # tensor indices computed from the inputs, with other parts
        if items is None:
            raise call.refuse(f"a key of more parts than the {x.rank} dims of the tensor")
        return advanced(call, x, items, zero_dim_selects=not aten)
    # Any other key: the flat positions it selects (all of it is known here).
    with torch.no_grad():
        flat = torch.arange(x.example.numel()).reshape(x.shape)
        positions = torch.ops.aten.index(flat, [None if isinstance(i, slice) else i
                                                for i in example_key]) \
            if aten else flat[example_key]
    return call.e.op("Gather", [call.e.reshape(x.name, (-1,)), call.e.tensor_const(positions)],
                     axis=0)


def _traced_parts(key: Any) -> bool:
    """Whether any part of the key is a value computed from the node's inputs (not a
    folded constant)."""
    if isinstance(key, Value):
        return not key.const
    if isinstance(key, (tuple, list)):
        return any(_traced_parts(item) for item in key)
    if isinstance(key, slice):
        return any(_traced_parts(v) for v in (key.start, key.stop, key.step))
    return False


@rule("pad")
def pad(call: Call) -> str:
    """F.pad: torch's pairs run from the last dim backwards; ONNX wants all begins,
    then all ends.  replicate is ONNX's edge, circular its wrap (opset 19)."""
    e = call.e
    x = call.args[0]
    widths = [int(v) for v in call.arg(1, "pad")]
    mode = call.arg(2, "mode", "constant")
    value = call.arg(3, "value", None)
    onnx_mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
                 "circular": "wrap"}.get(mode)
    if onnx_mode is None or (onnx_mode == "wrap" and call.opset < 19):
        raise call.refuse(f"mode={mode!r} at opset {call.opset}")
    begins, ends = [0] * x.rank, [0] * x.rank
    for k in range(len(widths) // 2):
        axis = x.rank - 1 - k
        begins[axis], ends[axis] = widths[2 * k], widths[2 * k + 1]
    # onnxruntime has no int16 / uint16 Pad kernel: padded in int32, exactly
    work = torch.int32 if x.dtype in (torch.int16, torch.uint16) else x.dtype
    inputs = [e.cast(x.name, x.dtype, work), e.ints(begins + ends)]
    if onnx_mode == "constant":
        inputs.append(operand(call, 0.0 if value is None else value, work, x.dtype))
    return e.cast(e.op("Pad", inputs, mode=onnx_mode), work, x.dtype)


@rule("broadcast_tensors")
def broadcast_tensors(call: Call) -> list[str]:
    """Each tensor expanded to the common shape (torch.distributions' broadcast_all)."""
    e = call.e
    tensors = list(call.args[0]) if len(call.args) == 1 and isinstance(call.args[0], (list, tuple)) \
        else list(call.args)
    results = []
    for t, out in zip(tensors, call.out):
        if not isinstance(t, Value):
            raise call.refuse("a non-tensor argument")
        if t.shape == tuple(out.shape):
            results.append(e.op("Identity", [t.name]))
        else:
            results.append(e.op("Expand", [t.name, e.ints(out.shape)]))
    return results
