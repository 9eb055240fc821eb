"""TracedTensor: the torch.Tensor subclass whose __torch_function__ is the C core's."""
from __future__ import annotations

import copy as _copy
from typing import Any

import torch

from .. import _core
from .numpy_array import to_numpy
from .numpy_ufuncs import tensor_ufunc


class TracedTensor(torch.Tensor):
    """A real tensor whose ops are recorded into the node that owns it.

    isinstance(x, torch.Tensor) stays true; every op runs eagerly on the real
    values and returns true values, and the C handler records it.
    """

    __torch_function__ = classmethod(_core.torch_function)

    def __reduce_ex__(self, protocol):  # pickles as the plain tensor it holds
        return plain(self).__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict | None) -> torch.Tensor:
        """A copy of the value: traced like clone() in its session, else a plain tensor.

        torch's default __deepcopy__ refuses subclasses without new_empty();
        while a session runs a traced value copies as clone() (a value of the
        same node, or the same published port), with requires_grad kept;
        otherwise the copy is the plain tensor's deepcopy.  The carrier is
        never copied: provenance comes from the recorded clone.
        """
        memo = {} if memo is None else memo
        found = memo.get(id(self))
        if found is not None:
            return found
        if _core.carrier_of(self) is not None and _core.session_thread() is not None:
            # Through the core like any op: recorded in the session's thread,
            # refused in another one when the node is still tracing.
            with torch.no_grad():
                copy = self.clone()
            if self.requires_grad:
                with torch._C.DisableTorchFunctionSubclass():
                    copy.requires_grad_(True)
        else:
            base = plain(self)
            memo.setdefault(id(memo), []).append(base)  # its id stays unique in memo
            copy = base.__deepcopy__(memo)
        extra = {k: v for k, v in vars(self).items() if k != "_leapp_carrier"}
        for key, value in extra.items():
            setattr(copy, key, _copy.deepcopy(value, memo))
        memo[id(self)] = copy
        return copy

    def numpy(self, *, force: bool = False):
        """The values as an ndarray; inside a tracing session a traced array."""
        return to_numpy(self, force=force)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """np.tanh(t) and friends: recorded while the node traces, else as for a tensor."""
        return tensor_ufunc(ufunc, method, inputs, kwargs)

    def __array__(self, dtype=None, copy=None):
        array = plain(self).detach().numpy()
        if dtype is not None and array.dtype != dtype:
            return array.astype(dtype)
        return array.copy() if copy else array


def plain(t: Any) -> Any:
    """A plain torch.Tensor sharing t's storage (t itself when already plain)."""
    if type(t) is TracedTensor:
        with torch._C.DisableTorchFunctionSubclass():
            return t.as_subclass(torch.Tensor)
    return t


def alias(t: torch.Tensor) -> TracedTensor:
    """A new TracedTensor object sharing t's storage, with no provenance."""
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(TracedTensor)


def clone_plain(t: torch.Tensor) -> torch.Tensor:
    """A detached plain copy of t's current value."""
    with torch._C.DisableTorchFunctionSubclass():
        return t.detach().clone().as_subclass(torch.Tensor)
