"""Release what torch's exporters keep alive after an export.

torch.export and the ONNX dynamo exporter trace through fake tensors and a
ShapeEnv.  Some of torch's caches outlive the export that filled them: the
ShapeEnv methods are wrapped by class-level ``functools.lru_cache`` objects
whose keys hold the instance (so every ShapeEnv, its FakeTensorMode, fake
tensors and the frame summaries of its guards stay alive), TorchScript keeps
the concrete type of every scripted class (fx makes one per GraphModule), the
functionalized-RNG tracker keeps the last fake state in a class attribute, and
make_fx keeps a map from fake tensor ids to the last export's graph nodes.
compile_graph() calls :func:`release_export_caches` after exporting, so
repeated compiles in one process keep memory flat.  Each step is a cache or
tracker reset, never a change of behaviour, and is skipped when the torch in
use does not have it.
"""
from __future__ import annotations

import sys

from ._logging import logger


def _clear_lru_methods(cls: type) -> int:
    """cache_clear() every lru_cache (or torch wrapper of one) defined on cls.

    Returns how many cached entries were dropped.
    """
    dropped = 0
    for attr in list(vars(cls).values()):
        clear, info = getattr(attr, "cache_clear", None), getattr(attr, "cache_info", None)
        if not callable(clear) or not callable(info):
            continue
        try:
            dropped += int(info().currsize)
            clear()
        except Exception as exc:  # a foreign cache_clear: best effort
            logger.debug("cache_clear() of %r failed: %s", attr, exc)
    return dropped


def _forget_graph_module_types() -> int:
    """Drop torch.jit's concrete types of fx GraphModule classes.

    fx makes a class per GraphModule, and TorchScript keeps the concrete
    type of every scripted module class (and its compiled methods) in a
    global store; a scripted module already made keeps its own type.
    """
    recursive, fx = sys.modules.get("torch.jit._recursive"), sys.modules.get("torch.fx")
    store = getattr(recursive, "concrete_type_store", None) if recursive else None
    graph_module = getattr(fx, "GraphModule", None) if fx else None
    types = getattr(store, "type_store", None)
    compiled = getattr(store, "methods_compiled", None)
    if not isinstance(types, dict) or not isinstance(graph_module, type):
        return 0
    dropped = 0
    for cls in [c for c in types if isinstance(c, type) and issubclass(c, graph_module)]:
        for concrete in types.pop(cls):
            dropped += 1
            if isinstance(compiled, set):
                compiled.discard(concrete)
    return dropped


def release_export_caches() -> None:
    """Drop torch's per-export leftovers (only modules already imported are touched)."""
    dropped = 0
    shapes = sys.modules.get("torch.fx.experimental.symbolic_shapes")
    if shapes is not None and isinstance(getattr(shapes, "ShapeEnv", None), type):
        dropped += _clear_lru_methods(shapes.ShapeEnv)
    dropped += _forget_graph_module_types()
    proxy = sys.modules.get("torch.fx.experimental.proxy_tensor")
    by_id = getattr(proxy, "_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT", None) if proxy else None
    if isinstance(by_id, dict):
        by_id.clear()  # ids of the finished export's fake tensors (torch clears it per export)
    rng = sys.modules.get("torch._decomp.decompositions_for_rng")
    tracker = getattr(rng, "PhiloxStateTracker", None) if rng is not None else None
    if tracker is not None and callable(getattr(tracker, "reset", None)):
        try:
            tracker.reset()
        except Exception as exc:  # a tracker reset is best effort
            logger.debug("PhiloxStateTracker.reset() failed: %s", exc)
    logger.debug("Released torch export caches (%d cached entries)", dropped)
