"""How torch functions are recorded: op kinds, functional rewrites of in-place
ops, and the small scriptable helpers the rewrites record.

The C handler asks classify() once per function and caches the answer; it
calls rewrite() only for in-place ops, which are rare on the hot path.
__setitem__ and copy_ are in-place ops of their own kind: outside a tracing
node, a full overwrite (dst[:] = src, dst[...] = src, dst.copy_(src)) from a
published value of the same shape and dtype adopts that value's port.  A
call with an out= tensor (torch.add(a, b, out=c)) is recorded like an in-place
write into c: the op without out=, its result bound to c.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import torch

from .. import _core
from . import escapes as _escapes
from .guards import conversion_kind
from .node_info import info
from .script import user_site

# The kinds classify() answers are the core's (csrc/leapp.h), exported by _core.
OP_PLAIN, OP_INPLACE, OP_COPY = _core.OP_PLAIN, _core.OP_INPLACE, _core.OP_COPY
OP_TO, OP_OVERWRITE, OP_VIEW = _core.OP_TO, _core.OP_OVERWRITE, _core.OP_VIEW
OP_SCRIPTED, OP_RANDOM = _core.OP_SCRIPTED, _core.OP_RANDOM

_COPY_NAMES = {"clone", "detach", "contiguous", "cpu", "cuda"}
# Functions that may return a view sharing their first argument's storage (the
# core then checks the storage and follows in-place writes across the views).
_VIEW_NAMES = {
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "ravel", "squeeze",
    "unsqueeze", "transpose", "swapaxes", "swapdims", "t", "permute", "movedim", "moveaxis",
    "expand", "expand_as", "broadcast_to", "narrow", "select", "__getitem__", "unfold",
    "diagonal", "as_strided", "split", "split_with_sizes", "chunk", "unbind", "tensor_split",
    "hsplit", "vsplit", "dsplit", "view_as_real", "view_as_complex", "alias", "adjoint",
    "atleast_1d", "atleast_2d", "atleast_3d", "type_as", "float", "double", "half", "int",
    "long", "bool", "type", "__get__", "align_as", "squeeze_copy",
    "slice", "_reshape_alias", "_unsafe_view",  # the aten ops TorchScript graphs call
}
_INPLACE_DUNDERS = {
    "__iadd__": "__add__", "__isub__": "__sub__", "__imul__": "__mul__",
    "__itruediv__": "__truediv__", "__ifloordiv__": "__floordiv__", "__imod__": "__mod__",
    "__ipow__": "__pow__", "__imatmul__": "__matmul__", "__iand__": "__and__",
    "__ior__": "__or__", "__ixor__": "__xor__", "__ilshift__": "__lshift__",
    "__irshift__": "__rshift__",
}
# In-place methods without a functional twin that only touch metadata.
_METADATA_INPLACE = {"requires_grad_", "retain_grad", "share_memory_", "detach_", "resize_",
                     "set_", "record_stream", "pin_memory"}


def _name(func: Any) -> str:
    return getattr(func, "__name__", "") or ""


# Random ops (torch.* functions, Tensor methods, torch.ops.aten overloads by
# their base name; dropout variants only in training mode, see is_random).
RANDOM_NAMES = {
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
    "normal", "bernoulli", "multinomial", "poisson", "binomial", "uniform_", "normal_",
    "exponential_", "geometric_", "cauchy_", "log_normal_", "random_", "bernoulli_",
    "_standard_gamma", "_sample_dirichlet", "native_dropout",
}
DROPOUT_NAMES = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                 "feature_alpha_dropout", "feature_dropout", "rrelu", "dropout_",
                 "alpha_dropout_", "feature_alpha_dropout_", "feature_dropout_", "rrelu_"}


def _aten_name(func: Any) -> str | None:
    """'add_' for torch.ops.aten.add_.Tensor / torch.ops.aten.add_, else None."""
    if isinstance(func, torch._ops.OpOverload):
        func = func.overloadpacket
    if isinstance(func, torch._ops.OpOverloadPacket):
        qualified = getattr(func, "_qualified_op_name", "")
        if qualified.startswith("aten::"):
            return qualified[len("aten::"):]
    return None


def random_name(func: Any) -> str | None:
    """The name of a (possibly) random torch function, else None."""
    name = _aten_name(func) or _name(func)
    if name in RANDOM_NAMES or name in DROPOUT_NAMES:
        return name
    return None


def is_random(func: Any, args: tuple, kwargs: dict | None) -> bool:
    """Whether this call of a random_name function draws random numbers."""
    name = random_name(func)
    if name not in DROPOUT_NAMES:
        return name is not None
    kwargs = kwargs or {}
    if "training" in kwargs or "train" in kwargs:
        return bool(kwargs.get("training", kwargs.get("train")))
    # F.dropout(x, p, training=True, inplace) / torch.dropout(x, p, train) /
    # aten.dropout(x, p, train): the flag is the third argument; F.rrelu's
    # is the fourth; F.dropout's default is training=True, torch's has none.
    index = 3 if name.startswith("rrelu") else 2
    if len(args) > index:
        return bool(args[index])
    return getattr(func, "__module__", "") == "torch.nn.functional"


def random_label(func: Any) -> str:
    """How a message names a random function: torch.randn_like, Tensor.uniform_, ..."""
    name = random_name(func) or _name(func)
    if _aten_name(func) is not None:
        return f"torch.ops.aten.{name}"
    if getattr(torch, name, None) is func:
        return f"torch.{name}"
    if getattr(torch.nn.functional, name, None) is func:
        return f"torch.nn.functional.{name}"
    if getattr(torch.Tensor, name, None) is func:
        return f"Tensor.{name}"
    return f"{getattr(func, '__module__', None) or 'torch'}.{name}"


def note_random(node: _core.Node, func: Any, args: tuple, kwargs: dict | None) -> None:
    """The core's hook for an op flagged OP_RANDOM in a tracing node: remember
    where a random op ran (validation names it when the node's outputs differ)."""
    if not is_random(func, args, kwargs):
        return
    found = (random_label(func),) + user_site()
    notes = info(node).random_ops
    if found not in notes:
        notes.append(found)


def _aten_twin(func: Any) -> Callable | None:
    """torch.ops.aten.X.overload for the in-place torch.ops.aten.X_.overload."""
    name = _aten_name(func)
    if not name or not name.endswith("_") or name.endswith("__"):
        return None
    base = getattr(torch.ops.aten, name[:-1], None)
    if base is None:
        return None
    if isinstance(func, torch._ops.OpOverload):
        return getattr(base, func._overloadname, None)
    return base


def functional_twin(func: Any) -> Callable | None:
    """The out-of-place function computing what the in-place func writes."""
    if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return _aten_twin(func)
    name = _name(func)
    if func is torch.Tensor.__ipow__:  # a torch._tensor wrapper named 'pow_'
        return torch.Tensor.__pow__
    if name in _INPLACE_DUNDERS:
        return getattr(torch.Tensor, _INPLACE_DUNDERS[name])
    if func is torch.Tensor.__setitem__:
        return index_write
    if func is torch.Tensor.copy_:
        return copy_write
    if func is torch.Tensor.fill_ or func is torch.fill_:
        return filled
    if func is torch.Tensor.zero_ or func is torch.zero_:
        return zeroed
    if name.endswith("_") and not name.endswith("__") and name not in _METADATA_INPLACE:
        base = name[:-1]
        twin = getattr(torch.Tensor, base, None)
        if twin is not None and getattr(torch.Tensor, name, None) is func:
            return twin
        twin = getattr(torch, base, None)
        if twin is not None and getattr(torch, name, None) is func:
            return twin
        twin = getattr(torch.nn.functional, base, None)
        if twin is not None and getattr(torch.nn.functional, name, None) is func:
            return twin
    return None


def classify(func: Any) -> int:
    """The kind of a torch function, cached by the C core per function."""
    if isinstance(func, (torch._C.ScriptMethod, torch._C.ScriptFunction)):
        return OP_SCRIPTED
    kind = _classify(func)
    return kind | OP_RANDOM if random_name(func) is not None else kind


def _classify(func: Any) -> int:
    name = _aten_name(func) or _name(func)  # a TorchScript graph's aten.detach.default: 'detach'
    if func is torch.Tensor.__setitem__ or func is torch.Tensor.copy_:
        return OP_OVERWRITE
    guard = conversion_kind(func)  # reads into Python, data-dependent shapes (leapp.tracing.guards)
    if guard is not None:
        return guard
    if functional_twin(func) is not None:
        return OP_INPLACE
    if name in _COPY_NAMES:
        return OP_COPY
    if name == "to":
        return OP_TO
    if name in _VIEW_NAMES:
        return OP_VIEW
    return OP_PLAIN


def _snapshot(t: Any) -> Any:
    """A plain receiver's value before the op mutates it (becomes a constant)."""
    if isinstance(t, torch.Tensor) and _core.carrier_of(t) is None:
        with torch._C.DisableTorchFunctionSubclass():
            return t.detach().clone()
    return t


def _has_traced(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return _core.carrier_of(obj) is not None
    if isinstance(obj, (tuple, list)):
        return any(_has_traced(o) for o in obj)
    return False


def rewrite(func: Any, args: tuple, kwargs: dict | None) -> tuple:
    """(func, args, kwargs) to record for an in-place op, before it runs."""
    kwargs = dict(kwargs or {})
    receiver = kwargs.get("out") if isinstance(kwargs.get("out"), torch.Tensor) else \
        (args[0] if args else None)
    if isinstance(receiver, torch.Tensor) and _core.carrier_of(receiver) is None:
        _escapes.on_plain_write(func, receiver, (args, kwargs))  # leapp.tracing.escapes
    if isinstance(kwargs.get("out"), torch.Tensor) and functional_twin(func) is None \
            and func is not torch.Tensor.__setitem__ and func is not torch.Tensor.copy_:
        # torch.add(a, b, out=c): c takes the result; the core binds it to c.
        del kwargs["out"]
        return func, tuple(args), kwargs
    if func is torch.Tensor.__setitem__:
        return _rewrite_setitem(*args)
    if func is torch.Tensor.copy_:
        dest, src = args[0], args[1]
        return copy_write, (dest, src), {}
    twin = functional_twin(func)
    if twin is filled:  # fill_(tensor) is a broadcast copy; fill_(number) a full_like
        if isinstance(args[1], torch.Tensor):
            return copy_write, (args[0], args[1]), {}
        return filled, (args[0], float(args[1])), {}
    rest = tuple(args[1:])
    return twin, (_snapshot(args[0]),) + rest, kwargs


def _rewrite_setitem(dest: torch.Tensor, key: Any, value: Any) -> tuple:
    if not isinstance(value, torch.Tensor):
        value = torch.tensor(value, dtype=dest.dtype)
    base = _snapshot(dest)
    if _has_traced(key):
        mask = key
        if (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool
                and tuple(mask.shape) == tuple(dest.shape)):
            return _masked_rewrite(dest, base, mask, value)
        carrier = next((c for c in (_core.carrier_of(k) for k in (
            key if isinstance(key, (tuple, list)) else (key,)) if isinstance(k, torch.Tensor))
            if c is not None), None)
        file, line = user_site()
        raise NotImplementedError(
            "Advanced indexing with TracedTensor indices is only auto-lowered for boolean masks "
            "of the destination's shape in an assignment; compute the result with torch.where() "
            "or index with a static key instead. (node "
            f"'{carrier.node.name if carrier is not None else '?'}', {file}:{line}: "
            "dest[key] = v with a traced key of another kind; for a mask over dest's leading "
            "dimensions, expand it to dest's shape: dest[mask[..., None].expand_as(dest)] = v)")
    with torch._C.DisableTorchFunctionSubclass():
        order = torch.arange(dest.numel()).reshape(tuple(dest.shape))
        positions = order[key].clone()
        if positions.shape == order.shape and torch.equal(positions, order):
            # dest[:] = value (rsl-rl's exporter writes its LSTM state so): a broadcast
            # copy, which an exported graph writes without baking dest's shape
            return copy_write, (base, value), {}
    return index_write, (base, positions, value), {}


def _masked_rewrite(dest: torch.Tensor, base: Any, mask: torch.Tensor,
                    value: torch.Tensor) -> tuple:
    """dest[mask] = value with a traced mask of dest's shape, as eager writes it.

    dest[mask] is the 1-D tensor of the True positions in row-major order, and value is
    broadcast to it: one element (a number, a [1] tensor that does not come from a
    selection) fills every True position (a where); a vector gives one element per True
    position, in order: Tensor.masked_scatter, which every backend exports with the
    count following the mask."""
    carrier = _core.carrier_of(value)
    with torch._C.DisableTorchFunctionSubclass():
        single = value.numel() == 1 and all(size == 1 for size in value.shape)
    if single and (carrier is None or not carrier.dynamic):
        return masked_write, (base, mask, value), {}
    # a vector: eager requires dest's dtype (index_put refuses another), as masked_scatter
    return torch.Tensor.masked_scatter, (base, mask, value), {}


def setitem_value(value: torch.Tensor, rank: int) -> torch.Tensor:
    """A setitem's value without the leading dimensions of size 1 it has beyond its
    target's rank, which torch drops (z[:] = x with x [1, 3] and z [3])."""
    extra = value.dim() - rank
    if extra <= 0:
        return value
    if any(size != 1 for size in value.shape[:extra]):  # eager refuses it first
        raise RuntimeError(f"a value of shape {list(value.shape)} cannot be written into "
                           f"{rank} dimensions")
    return value.reshape(value.shape[extra:])


def index_write(dest: torch.Tensor, idx: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """dest with value written at the flat positions idx (a functional setitem)."""
    flat = dest.reshape(-1).clone()
    value = setitem_value(value.to(dest.dtype), idx.dim())
    flat[idx.reshape(-1)] = value.expand(idx.shape).reshape(-1)
    return flat.reshape(dest.shape)


def gather_positions(src: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The elements of src at the flat positions given (shaped like positions):
    the value of a view whose memory a write on src covered entirely."""
    return src.reshape(-1)[positions]


def scatter_positions(dest: torch.Tensor, dest_pos: torch.Tensor, src: torch.Tensor,
                      src_pos: torch.Tensor) -> torch.Tensor:
    """dest with src's elements at src_pos written to its flat positions dest_pos:
    the value of a view whose memory a write on src covered in part."""
    flat = dest.reshape(-1).clone()
    flat[dest_pos] = src.reshape(-1)[src_pos].to(dest.dtype)
    return flat.reshape(dest.shape)


def masked_write(dest: torch.Tensor, mask: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """dest with value where mask is true (a functional dest[mask] = value)."""
    return torch.where(mask, value.to(dest.dtype), dest)


def copy_write(dest: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """The value dest holds after dest.copy_(src), or dest[:] = src."""
    return setitem_value(src.to(dest.dtype), dest.dim()).expand(dest.shape).clone()


def filled(dest: torch.Tensor, value: float) -> torch.Tensor:
    """The value dest holds after dest.fill_(value) with a Python number."""
    return torch.full_like(dest, value)


def zeroed(dest: torch.Tensor) -> torch.Tensor:
    """The value dest holds after dest.zero_()."""
    return torch.zeros_like(dest)


def reverse_dims(x: torch.Tensor) -> torch.Tensor:
    """x.T for any rank."""
    dims = [x.dim() - 1 - i for i in range(x.dim())]
    return x.permute(dims)


# Python operators whose reversed dunder (__radd__...) swaps operands.
BINARY_OPERATORS = {
    name: getattr(operator, name)
    for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_",
                 "or_", "xor", "lshift", "rshift", "eq", "ne", "lt", "le", "gt", "ge",
                 "getitem", "neg", "pos", "invert", "abs")
}
