"""TracedTensor: the torch.Tensor subclass whose __torch_function__ is the C core's."""
from __future__ import annotations

from typing import Any

import torch

from . import _core


class TracedTensor(torch.Tensor):
    """A real tensor whose ops are recorded into the node that owns it.

    isinstance(x, torch.Tensor) stays true; every op runs eagerly on the real
    values and returns true values, and the C handler records it.
    """

    __torch_function__ = classmethod(_core.torch_function)

    def __reduce_ex__(self, protocol):  # pickles as the plain tensor it holds
        return plain(self).__reduce_ex__(protocol)

    def numpy(self, *, force: bool = False):
        """The values as an ndarray; inside a tracing session a traced array."""
        from ._numpy import to_numpy
        return to_numpy(self, force=force)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """np.tanh(t) and friends: recorded while the node traces, else as for a tensor."""
        from ._numpy import tensor_ufunc
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
