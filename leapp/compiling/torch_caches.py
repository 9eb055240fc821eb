"""Release what torch's exporters keep alive after an export.

torch.export and the ONNX dynamo exporter trace through fake tensors and a
ShapeEnv.  Some of torch's caches outlive the export that filled them: the
ShapeEnv methods are wrapped by class-level ``functools.lru_cache`` objects
whose keys hold the instance (so every ShapeEnv, its FakeTensorMode, fake
tensors and the frame summaries of its guards stay alive), TorchScript keeps
the concrete type of every scripted class (fx makes one per GraphModule, and
torch.jit.trace one wrapper class per traced module), the functionalized-RNG
tracker keeps the last fake state in a class attribute, make_fx keeps a map
from fake tensor ids to the last export's graph nodes, and fx keeps the
generated source of every GraphModule it ever compiled (exporters make and
drop a dozen per export) in its loader and in linecache.
compile_graph() calls :func:`release_export_caches` after exporting, so
repeated compiles in one process keep memory flat.  Each step is a cache or
tracker reset, never a change of behaviour, and is skipped when the torch in
use does not have it.
"""
from __future__ import annotations

import linecache
import re
import sys
import types
from collections.abc import Iterator

from ..bundle.log import logger

# The cache keys (pseudo file names) fx gives generated code: a counter, and
# optionally where the graph came from.
_FX_KEY = re.compile(r"<eval_with_key>\.(\d+)(?: from .*)?\Z", re.DOTALL)


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
    """Drop torch.jit's concrete types of fx GraphModule classes and of traced modules.

    fx makes a class per GraphModule, and TorchScript keeps the concrete
    type of every scripted module class (and its compiled methods) in a
    global store; a scripted module already made keeps its own type.
    torch.jit.trace builds an unshared concrete type per traced module and
    marks it compiled in the same store; nothing looks an unshared type up
    again once its module is built, but the mark keeps it (and its wrapper
    class) alive.
    """
    recursive, fx = sys.modules.get("torch.jit._recursive"), sys.modules.get("torch.fx")
    store = getattr(recursive, "concrete_type_store", None) if recursive else None
    graph_module = getattr(fx, "GraphModule", None) if fx else None
    types_by_class = getattr(store, "type_store", None)
    compiled = getattr(store, "methods_compiled", None)
    if not isinstance(types_by_class, dict) or not isinstance(graph_module, type):
        return 0
    dropped = 0
    for cls in [c for c in types_by_class
                if isinstance(c, type) and issubclass(c, graph_module)]:
        for concrete in types_by_class.pop(cls):
            dropped += 1
            if isinstance(compiled, set):
                compiled.discard(concrete)
    if isinstance(compiled, set):
        shared = {id(concrete) for kept in types_by_class.values() for concrete in kept}
        unshared = [concrete for concrete in compiled if id(concrete) not in shared]
        compiled.difference_update(unshared)
        dropped += len(unshared)
    return dropped


class _FxSources:
    """The fx-generated sources that release_export_caches still has to look at."""

    def __init__(self) -> None:
        self.next_id = 0      # keys from this counter value on have not been seen yet
        self.waiting: set[str] = set()  # seen at the last release, judged at the next
        self.kept: set[str] = set()     # judged, but their code was still in use


_FX_SOURCES = _FxSources()


def _frames_in_use() -> Iterator[types.FrameType]:
    """Frames that may still show source lines: running ones and those of kept tracebacks."""
    for frame in sys._current_frames().values():
        while frame is not None:
            yield frame
            frame = frame.f_back
    errors = [sys.exc_info()[1], getattr(sys, "last_value", None), getattr(sys, "last_exc", None)]
    seen: set[int] = set()
    while errors:
        error = errors.pop()
        if not isinstance(error, BaseException) or id(error) in seen:
            continue
        seen.add(id(error))
        errors += [error.__cause__, error.__context__]
        tb = error.__traceback__
        while tb is not None:
            yield tb.tb_frame
            tb = tb.tb_next


def _fx_keys_in_use(graph_module: type) -> set[str]:
    """Source keys of the code of every live GraphModule class, and of frames in use.

    fx puts each generated forward on the GraphModule's own class, so a
    class that is gone means its code is gone, unless a frame still runs it
    or a kept traceback shows it.
    """
    keys: set[str] = set()
    classes, seen = [graph_module], set()
    while classes:
        cls = classes.pop()
        if id(cls) in seen:
            continue
        seen.add(id(cls))
        classes.extend(cls.__subclasses__())
        for attr in list(vars(cls).values()):
            code = getattr(attr, "__code__", None)
            if isinstance(code, types.CodeType):
                keys.add(code.co_filename)
    keys.update(frame.f_code.co_filename for frame in _frames_in_use())
    return keys


def _release_fx_sources(state: _FxSources) -> int:
    """Drop the cached sources of fx code that no live class, frame or traceback uses.

    Exports make and discard GraphModules, and fx keeps every generated
    source, in its loader and in linecache, for good.  A key is judged one
    release after it is first seen (another thread may be between fx caching
    the source and putting the code on its class), and judged again while
    its code is in use; keys made before leapp's first release are judged too.
    """
    module = sys.modules.get("torch.fx.graph_module")
    loader = getattr(module, "_loader", None) if module is not None else None
    sources = getattr(loader, "eval_cache", None)
    next_id = getattr(loader, "next_id", None)
    graph_module = getattr(module, "GraphModule", None) if module is not None else None
    if not isinstance(sources, dict) or not isinstance(next_id, int) \
            or not isinstance(graph_module, type):
        return 0
    fresh = set()
    for key in list(sources):
        match = _FX_KEY.match(key) if isinstance(key, str) else None
        if match is not None and state.next_id <= int(match.group(1)) < next_id:
            fresh.add(key)
    state.next_id = next_id
    candidates = state.waiting | state.kept
    state.waiting = fresh
    in_use = _fx_keys_in_use(graph_module)
    state.kept = candidates & in_use
    dropped = 0
    for key in candidates - in_use:
        sources.pop(key, None)
        linecache.cache.pop(key, None)
        dropped += 1
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
    dropped += _release_fx_sources(_FX_SOURCES)
    logger.debug("Released torch export caches (%d cached entries)", dropped)
