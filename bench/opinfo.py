"""PyTorch's op database (OpInfo) through leapp's ONNX export, against eager.

    python bench/opinfo.py [--ops fmax,nanmean] [--dtypes float32,int32]
                           [--limit-per-op 2] [--shard 0/4] [--out census.json]
                           [--python OTHER_PYTHON]        # the run, in worker processes
    python bench/opinfo.py --markdown ours.json [torch.json [upstream.json]]
    python bench/opinfo.py --compare ours.json torch.json upstream.json --report out.md

Every sample of ``torch.testing._internal.common_methods_invocations.op_db``
(up to ``--limit-per-op`` per dtype, for float32, float16, int64, int32 and bool
where ``op.supported_dtypes('cpu')`` has them) becomes one traced node: the
sample's tensors (its input, and the tensors among its args and kwargs, in
lists too) are the node's inputs, ``op.op(input, *args, **kwargs)`` is traced,
its tensor outputs are the node's outputs, exported with ``export_with="onnx"``
and compiled (``compile_graph``, the picture off).  The saved ``<node>.onnx``
then runs in onnxruntime against eager ``op.op`` on

* ``sample``: the traced inputs themselves;
* ``redraw0`` / ``redraw1``: new inputs of the same shapes and dtypes: floats
  uniform in the sample tensor's own range (sorted again where the sample was
  sorted, rounded where it held whole numbers), integers and bools as a
  permutation of the sample's values (indices stay indices, unique stay
  unique);
* adversarial copies, each once with the special values at positions
  ``(flat index + input number) % 3 == 0`` (``/p0``) and once at ``== 1``
  (``/p1``), so two inputs never carry them at the same places:
  ``nan``, ``posinf``, ``neginf``, ``negzero``, ``large`` (1e30 for float32,
  6e4 for float16, signs alternating), ``mixed`` (NaN, +inf, -inf, -0.0 in
  turn) in every floating input; ``int_min``, ``int_max`` (the dtype's edges)
  and ``int_wide`` (every element drawn across the dtype's range) in every
  integer input.  An input eager raises on is not checked; an adversarial one
  the exported model raises on is recorded (``raises``), not counted wrong: it
  is loud, not silent (an index beyond its dimension: onnxruntime raises, some
  eager kernels read whatever memory lies there).

The comparison: the same shape and dtype; NaN where eager has NaN and only
there; +-inf equal; integers and bools exact; floats within rtol 1e-4 / atol
1e-5 (float16: 1e-2 / 1e-3), or, where eager's float32 result is itself that far
from eager's float64 result, within twice that rounding.  An input onnxruntime
refuses that eager accepts is a difference too.

Each sample ends as one outcome:

* ``exact``: exported and equal on every input checked;
* ``fell_back``: exported by torch's exporter after leapp's writer passed the
  node on (log.txt says "exported with torch's ONNX exporter"), equal on every
  input checked;
* ``wrong``: exported, and different from eager on some input (silently wrong:
  the bundle validated); the inputs and their differences are recorded;
* ``refused``: leapp raised (at an annotation or at compile) with a reason,
  recorded with its first line;
* ``trace_error``: the op raised under tracing although it runs eagerly;
* ``crashed``: the worker process died or hung on the sample;
* ``skipped``: a sample this harness does not drive (no tensor input, complex or
  sparse tensors, a non-tensor output, an op that is random or returns memory it
  never wrote, eager failing on the sample itself).

The script uses leapp's public API only (start, annotate.input_tensors,
annotate.output_tensors, stop, compile_graph), so it runs under upstream leapp
0.7.2 as well: ``--python`` runs the workers under another interpreter
(``make opinfo`` hands it .compat-venv's).  ``LEAPP_ONNX_WRITER=torch`` in the
environment reaches the workers, so the same run measures torch's exporter
behind ours.  Workers are restarted after a crash or a hang (``--timeout``
seconds without finishing a sample), the sample recorded as ``crashed``.

Output: a JSON census (``meta``, ``samples``, ``ops``: outcome counts per op,
``families``: per op family) and, with ``--markdown``, the table of
docs/backends.md's op-database section.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GRAPH = "opinfo"
NODE = "op"
DTYPES = ("float32", "float16", "int64", "int32", "bool")
OUTCOMES = ("exact", "fell_back", "wrong", "warned", "refused", "trace_error", "crashed",
            "skipped")
FAMILIES = ("elementwise unary", "elementwise binary", "reductions and scans",
            "shapes and indexing", "linalg", "nn.functional", "other")
FELL_BACK = "exported with torch's ONNX exporter"  # what log.txt says of such a node
TOLERANCES = {"float16": (1e-2, 1e-3), "float32": (1e-4, 1e-5), "float64": (1e-4, 1e-5)}
LARGE = {"float16": 6e4, "float32": 1e30, "float64": 1e30}
FLOAT_KINDS = ("nan", "posinf", "neginf", "negzero", "large", "mixed")
INT_KINDS = ("int_min", "int_max", "int_wide")
# Ops whose output is memory they never wrote (no export can reproduce it).
UNWRITTEN = re.compile(r"(^|\.)(new_)?empty(_like|_strided|_permuted)?$")

# --------------------------------------------------------------------------
# Families

_LINALG = re.compile(r"^(linalg\.|mm$|bmm$|mv$|dot$|vdot$|inner$|outer$|ger$|addmm|addmv|"
                     r"addbmm|baddbmm|addr$|matmul$|__rmatmul__$|chain_matmul$|kron$|"
                     r"tensordot$|einsum$|cholesky|lu|qr$|svd|pinverse$|inverse$|det$|"
                     r"logdet$|slogdet$|triangular_solve$|geqrf$|ormqr$|cross$|trace$|"
                     r"tril$|triu$|diag_embed$|cdist$|renorm$|norm$|frobenius_norm$|"
                     r"nuclear_norm$|symeig$|eig|matrix_exp$|block_diag$|cov$|corrcoef$)")
_REDUCE = re.compile(r"^(sum|nansum|mean|nanmean|prod|amax|amin|aminmax|argmax|argmin|max|min|"
                     r"median|nanmedian|mode|kthvalue|std|var|std_mean|var_mean|logsumexp|"
                     r"all|any|count_nonzero|cumsum|cumprod|cummax|cummin|logcumsumexp|"
                     r"cumulative_trapezoid|trapz|trapezoid|sort|msort|argsort|topk|"
                     r"quantile|nanquantile|histc|bincount|unique|unique_consecutive|"
                     r"special\.logsumexp|dist|_segment_reduce|segment_reduce)(\.|$)")
_SHAPE = re.compile(r"^(reshape|reshape_as|view|view_as|permute|transpose|swapaxes|swapdims|"
                    r"moveaxis|movedim|t$|mT|mH|T$|H$|adjoint|cat|concat|concatenate|stack|"
                    r"hstack|vstack|dstack|column_stack|row_stack|split|split_with_sizes|"
                    r"tensor_split|hsplit|vsplit|dsplit|chunk|unbind|squeeze|unsqueeze|"
                    r"expand|expand_as|expand_copy|broadcast|repeat|tile|flip|fliplr|flipud|"
                    r"rot90|roll|narrow|select|slice|index_|take|take_along_dim|gather|"
                    r"scatter|put|masked_|nonzero|argwhere|flatten|unflatten|ravel|diag|"
                    r"diagonal|diagflat|atleast_|as_strided|meshgrid|contiguous|clone|"
                    r"where|__getitem__|resize|unfold|fill|zero_|full_like|ones_like|"
                    r"zeros_like|new_|triu_indices|tril_indices|searchsorted|bucketize|"
                    r"combinations|cartesian_prod|item|tolist|view_copy|squeeze_copy|"
                    r"t_copy|permute_copy|unsqueeze_copy|transpose_copy|alias_copy|"
                    r"repeat_interleave|one_hot|_unsafe_masked_index)")


_ELEMENTWISE_N = re.compile(r"^(clamp|clip|lerp|addcmul|addcdiv|where|masked_fill|"
                            r"float_power|true_divide|heaviside|copysign|ldexp|xlogy)(_|\.|$)")


def family(op) -> str:
    """A coarse family of an OpInfo entry, from its name and its OpInfo class."""
    return family_of(op.name, type(op).__name__)


def family_of(name: str, kind: str) -> str:
    """The family of an op named ``name`` whose OpInfo class is ``kind``."""
    if name.startswith("nn.functional.") or name.startswith("_softmax") or \
            name in ("softmax", "log_softmax", "special.softmax", "special.log_softmax"):
        return "nn.functional"
    if name.startswith("fft.") or kind == "SpectralFuncInfo":
        return "other"
    if _LINALG.match(name):
        return "linalg"
    if kind == "ReductionOpInfo":
        return "reductions and scans"
    if kind == "UnaryUfuncInfo":
        return "elementwise unary"
    if kind == "BinaryUfuncInfo" or _ELEMENTWISE_N.match(name):
        return "elementwise binary"
    if _REDUCE.match(name):
        return "reductions and scans"
    if kind == "ShapeFuncInfo" or _SHAPE.match(name):
        return "shapes and indexing"
    return "other"


def op_key(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def load_op_db() -> list:
    from torch.testing._internal.common_methods_invocations import op_db
    return list(op_db)


# --------------------------------------------------------------------------
# Samples and inputs

def _dtype(name):
    import torch
    return getattr(torch, name)


def flatten_sample(sample):
    """(leaves, spec, tensor positions) of (input, args, kwargs), or a skip reason."""
    import torch
    from torch.utils import _pytree as pytree
    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    positions = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            if leaf.layout != torch.strided or leaf.is_sparse:
                return None, "a sparse or non-strided tensor"
            if leaf.is_complex() or leaf.is_quantized or leaf.dtype == torch.bfloat16:
                return None, "a %s tensor" % str(leaf.dtype).replace("torch.", "")
            positions.append(i)
    if not positions:
        return None, "no tensor among the sample's arguments"
    return (leaves, spec, positions), None


def call(op, leaves, spec, positions, tensors):
    """op.op on the sample's arguments with its tensors replaced by ``tensors``."""
    from torch.utils import _pytree as pytree
    leaves = list(leaves)
    for pos, t in zip(positions, tensors):
        leaves[pos] = t
    inp, args, kwargs = pytree.tree_unflatten(leaves, spec)
    return op.op(inp, *args, **kwargs)


def flatten_outputs(out):
    """The tensors of an op's result, or None when it holds something else."""
    import torch
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and out and all(isinstance(o, torch.Tensor) for o in out):
        return list(out)
    return None


def _gen(*parts):
    import torch
    g = torch.Generator()
    g.manual_seed(zlib.crc32("|".join(str(p) for p in parts).encode()))
    return g


def _integral(x):
    import torch
    finite = x[torch.isfinite(x)]
    return finite.numel() > 0 and bool((finite == finite.round()).all())


def redraw(tensors, seed):
    """Inputs of the same shapes, dtypes and scale (see the module docstring)."""
    import torch
    out = []
    for i, x in enumerate(tensors):
        g = _gen(seed, i)
        if x.numel() == 0:
            out.append(x.clone())
        elif x.is_floating_point():
            xf = x.double()
            finite = xf[torch.isfinite(xf)]
            if finite.numel() == 0 or float(finite.min()) == float(finite.max()):
                out.append(x.clone())
                continue
            lo, hi = float(finite.min()), float(finite.max())
            y = torch.rand(x.shape, generator=g, dtype=torch.float64) * (hi - lo) + lo
            if _integral(xf):
                y = y.round()
            if x.dim() >= 1 and x.shape[-1] > 1 and bool((xf.diff(dim=-1) >= 0).all()):
                y = y.sort(dim=-1).values
            out.append(y.to(x.dtype))
        else:
            perm = torch.randperm(x.numel(), generator=g)
            out.append(x.reshape(-1)[perm].reshape(x.shape).clone())
    return out


def _edges(dtype):
    import torch
    info = torch.iinfo(dtype)
    return info.min, info.max


def adversarial(tensors, kind, pattern):
    """A copy of the inputs with ``kind`` at the pattern's positions; None when no input
    of the kind's sort exists."""
    import torch
    out, touched = [], False
    for i, x in enumerate(tensors):
        y = x.clone()
        is_float = x.is_floating_point()
        is_int = not is_float and x.dtype != torch.bool
        if x.numel() == 0 or (kind in FLOAT_KINDS and not is_float) or \
                (kind in INT_KINDS and not is_int):
            out.append(y)
            continue
        flat = y.reshape(-1)
        idx = torch.arange(flat.numel())
        mask = (idx + i) % 3 == pattern
        if kind == "int_wide":
            lo, hi = _edges(x.dtype)
            g = _gen("wide", i, pattern)
            if x.dtype == torch.int64:
                vals = torch.randint(-2 ** 62, 2 ** 62, flat.shape, generator=g, dtype=torch.int64)
            else:
                vals = torch.randint(lo, hi, flat.shape, generator=g,
                                     dtype=torch.int64).to(x.dtype)
            flat.copy_(vals)
            out.append(flat.reshape(x.shape))
            touched = True
            continue
        if not bool(mask.any()):
            out.append(y)
            continue
        name = str(x.dtype).replace("torch.", "")
        if kind == "nan":
            flat[mask] = float("nan")
        elif kind == "posinf":
            flat[mask] = float("inf")
        elif kind == "neginf":
            flat[mask] = float("-inf")
        elif kind == "negzero":
            flat[mask] = -0.0
        elif kind == "large":
            big = LARGE.get(name, 1e30)
            signs = torch.where(idx % 2 == 0, 1.0, -1.0).to(x.dtype)
            flat[mask] = (signs * big)[mask]
        elif kind == "mixed":
            specials = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0],
                                    dtype=x.dtype)
            flat[mask] = specials[(idx // 3) % 4][mask]
        elif kind in ("int_min", "int_max"):
            lo, hi = _edges(x.dtype)
            flat[mask] = lo if kind == "int_min" else hi
        out.append(flat.reshape(x.shape))
        touched = True
    return out if touched else None


#: what leapp's log says of a model of torch's exporter that differs from eager on fresh
#: inputs (leapp.compiling.backends.onnx.TORCH_MODEL_DIFFERS): a difference the compile
#: named at WARNING is counted "warned", not silently wrong
TORCH_MODEL_DIFFERS = "its ONNX model, written by torch's ONNX exporter, differs from eager"


def _eager_nan_left_out(e, g, only_infinite=False):
    """On the +-inf copies, the positions where eager's result is NaN left out of the
    comparison (eager's inf - inf or inf * 0 inside a composite op is an accident of its
    order of operations, as leapp's own fresh-input check rules).  On the mixed copies,
    which hold NaN too, only where the export's is infinite (NaN and inf are both the
    overflowed outcome; a number there would be a NaN input lost)."""
    import numpy as np
    import torch
    if not e.is_floating_point():
        return e, g
    nan = torch.isnan(e).numpy()
    g = np.array(g, copy=True)
    if only_infinite:
        nan = nan & np.isinf(g)
    if not nan.any():
        return e, g
    g[nan] = np.nan
    return e, g


#: ops whose index output orders equal values as eager's kernel happens to (torch
#: documents no order): judged by the values the indices select, not the indices
TIE_ORDERED = frozenset({"topk"})


def _selects_the_same(x, indices, values):
    """Whether indices pick values out of x along some dim (NaN where values has NaN)."""
    import numpy as np
    import torch
    idx = torch.from_numpy(np.asarray(indices)) if not isinstance(indices, torch.Tensor) \
        else indices
    if x.dim() == 0 or idx.dtype != torch.int64 or idx.shape != values.shape:
        return False
    for dim in range(x.dim()):
        try:
            picked = torch.take_along_dim(x, idx, dim)
        except (RuntimeError, IndexError):
            continue
        if picked.shape == values.shape and torch.equal(torch.isnan(picked),
                                                        torch.isnan(values)) \
                and torch.equal(picked.nan_to_num(0.0), values.nan_to_num(0.0)):
            return True
    return False


def input_kinds(tensors, seed):
    """[(kind name, inputs)]: the sample, two redraws, the adversarial copies."""
    kinds = [("sample", [t.clone() for t in tensors])]
    for r in range(2):
        kinds.append(("redraw%d" % r, redraw(tensors, "%s|%d" % (seed, r))))
    for kind in FLOAT_KINDS + INT_KINDS:
        for pattern in (0, 1):
            if kind == "int_wide" and pattern == 1:
                continue
            copy = adversarial(tensors, kind, pattern)
            if copy is not None:
                kinds.append((kind if kind == "int_wide" else "%s/p%d" % (kind, pattern), copy))
    return kinds


# --------------------------------------------------------------------------
# Comparison

def _np_dtype(t):
    import torch
    return torch.empty(0, dtype=t.dtype).numpy().dtype


def _fmt(v):
    return "%.3g" % v if isinstance(v, float) else str(v)


def _float_allowed(ref, ref64, rtol, atol):
    """Elementwise tolerance: the fixed one, or twice eager's own rounding (float64)."""
    import torch
    allowed = atol + rtol * ref.double().abs()
    if ref64 is not None and ref64.shape == ref.shape:
        own = (ref.double() - ref64.double()).abs()
        own = torch.where(torch.isfinite(own), own, torch.zeros_like(own))
        allowed = torch.maximum(allowed, 2 * own)
    return allowed


def compare(ref, got, ref64=None, overflow=0.0):
    """None when ``got`` (a numpy array) equals eager's ``ref``, else a description.

    ``overflow`` > 0 (inputs holding that magnitude): finite values within it of each
    other are equal (sums of +-1e30 cancel in any order), and NaN and +-inf are one
    outcome (inf - inf is NaN in one summation order and inf in another); a finite
    value where the other side overflowed still differs."""
    import numpy as np
    import torch
    if tuple(got.shape) != tuple(ref.shape):
        return "shape %s where eager gives %s" % (list(got.shape), list(ref.shape))
    if got.dtype != _np_dtype(ref):
        return "dtype %s where eager gives %s" % (got.dtype, _np_dtype(ref))
    g = torch.from_numpy(np.ascontiguousarray(got))
    r = ref.detach().contiguous()
    if not r.is_floating_point():
        if r.dtype == torch.bool:
            bad = (g != r)
            if bool(bad.any()):
                return "%d of %d bools differ" % (int(bad.sum()), r.numel())
            return None
        bad = (g.long() != r.long()) if r.dtype != torch.uint8 else (g != r)
        if bool(bad.any()):  # Python ints: a double cannot tell int64s 64 apart
            flat = bad.reshape(-1)
            diff = max(abs(int(a) - int(b)) for a, b in zip(g.reshape(-1)[flat].tolist(),
                                                            r.reshape(-1)[flat].tolist()))
            k = int(bad.reshape(-1).nonzero()[0])
            return "%d of %d integers differ, max abs diff %s (eager %s, onnx %s)" % (
                int(bad.sum()), r.numel(), _fmt(diff), r.reshape(-1)[k].item(),
                g.reshape(-1)[k].item())
        return None
    name = str(r.dtype).replace("torch.", "")
    rtol, atol = TOLERANCES.get(name, (1e-4, 1e-5))
    rn, gn = torch.isnan(r), torch.isnan(g)
    if overflow:
        rf, gf = torch.isfinite(r), torch.isfinite(g)
        bad = rf != gf
        if bool(bad.any()):
            k = int(bad.reshape(-1).nonzero()[0])
            return "%d of %d positions finite on one side only (eager %s, onnx %s)" % (
                int(bad.sum()), r.numel(), _fmt(r.reshape(-1)[k].item()),
                _fmt(g.reshape(-1)[k].item()))
        diff = torch.where(rf, (g.double() - r.double()).abs(),
                           torch.zeros((), dtype=torch.float64))
        limit = overflow * torch.finfo(r.dtype).eps * 1024
        if bool((diff > limit + rtol * r.double().abs().where(rf, 0.0)).any()):
            return "values differ by up to %s on inputs of magnitude %s (eager %s)" % (
                _fmt(diff.max().item()), _fmt(overflow), _fmt(r.reshape(-1)[0].item()))
        return None
    if bool((rn != gn).any()):
        k = int((rn != gn).reshape(-1).nonzero()[0])
        return "NaN at %d of %d positions differ (eager %s, onnx %s)" % (
            int((rn != gn).sum()), r.numel(), _fmt(r.reshape(-1)[k].item()),
            _fmt(g.reshape(-1)[k].item()))
    ri, gi = torch.isinf(r), torch.isinf(g)
    inf_bad = (ri | gi) & ~(r == g)
    if bool(inf_bad.any()):
        k = int(inf_bad.reshape(-1).nonzero()[0])
        return "inf at %d of %d positions differ (eager %s, onnx %s)" % (
            int(inf_bad.sum()), r.numel(), _fmt(r.reshape(-1)[k].item()),
            _fmt(g.reshape(-1)[k].item()))
    fin = ~(rn | ri)
    if not bool(fin.any()):
        return None
    diff = (g.double() - r.double()).abs()
    allowed = _float_allowed(r, ref64, rtol, atol)
    bad = fin & (diff > allowed)
    if bool(bad.any()):
        k = int(bad.reshape(-1).nonzero()[0])
        return "%d of %d values beyond rtol %g / atol %g, max abs diff %s (eager %s, onnx %s)" % (
            int(bad.sum()), r.numel(), rtol, atol, _fmt(diff[fin].max().item()),
            _fmt(r.reshape(-1)[k].item()), _fmt(g.reshape(-1)[k].item()))
    return None


# --------------------------------------------------------------------------
# One sample

def _first_line(text):
    text = (text or "").strip()
    return text.splitlines()[0][:400] if text else ""


def _compile_kwargs(leapp):
    """visualize=False and verbose=False where this leapp's compile_graph takes them."""
    import inspect
    try:
        params = inspect.signature(leapp.compile_graph).parameters
    except (TypeError, ValueError):
        return {}
    return {k: False for k in ("visualize", "verbose") if k in params}


def _eager(op, flat, tensors):
    import torch
    with torch.no_grad():
        return flatten_outputs(call(op, *flat, [t.clone() for t in tensors]))


def _eager64(op, flat, tensors):
    """Eager in float64 (floating inputs widened), or None."""
    import torch
    if not any(t.is_floating_point() for t in tensors):
        return None
    try:
        with torch.no_grad():
            outs = flatten_outputs(call(op, *flat, [t.double() if t.is_floating_point()
                                                    else t.clone() for t in tensors]))
    except Exception:  # noqa: BLE001  an op without float64
        return None
    return outs


def _same(a, b):
    import torch
    if a is None or b is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.is_floating_point():
            if not bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all()):
                return False
        elif not bool((x == y).all()):
            return False
    return True


def _bundle_files(bundle):
    onnx_files, log_text = [], ""
    for dirpath, _, files in os.walk(bundle):
        for f in files:
            if f.endswith(".onnx") and "_fused" not in f:
                onnx_files.append(os.path.join(dirpath, f))
            elif f == "log.txt":
                with open(os.path.join(dirpath, f), errors="replace") as h:
                    log_text += h.read()
    return sorted(onnx_files), log_text


def ort_session(path):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def feeds(sess, names, tensors):
    """onnxruntime's feed: by port name where the model keeps them, else in order."""
    by_name = dict(zip(names, tensors))
    model_inputs = [i.name for i in sess.get_inputs()]
    if all(n in by_name for n in model_inputs):
        chosen = [by_name[n] for n in model_inputs]
    else:
        kept = [n for n in names if n in model_inputs]
        chosen = [by_name[n] for n in kept] if len(kept) == len(model_inputs) else \
            list(tensors)[:len(model_inputs)]
    return {n: t.detach().contiguous().numpy() for n, t in zip(model_inputs, chosen)}


def _outputs_in_order(sess, results, out_names):
    names = [o.name for o in sess.get_outputs()]
    if all(n in names for n in out_names):
        return [results[names.index(n)] for n in out_names]
    return list(results)


def _base(op, dtype, index):
    return {"op": op_key(op), "name": op.name, "kind": type(op).__name__,
            "family": family(op), "dtype": dtype, "index": index}


def run_sample(op, dtype, index, sample, workdir, leapp=None):
    """The record of one sample (see the module docstring for its outcome)."""
    import torch
    rec = dict(_base(op, dtype, index), outcome=None, reason="", message="", stage="",
               writer=None, fell_back="", checked=0, failures=[], seconds=0.0)
    t0 = time.perf_counter()
    flat, why = flatten_sample(sample)
    if flat is None:
        rec.update(outcome="skipped", reason=why)
        return rec
    leaves, spec, positions = flat
    tensors = [leaves[p].detach() for p in positions]
    flat = (leaves, spec, positions)
    rec["shapes"] = [list(t.shape) for t in tensors]
    rec["input_dtypes"] = [str(t.dtype).replace("torch.", "") for t in tensors]
    # Eager on the sample, twice: a random op (or memory never written) differs.
    if UNWRITTEN.search(op.name):
        rec.update(outcome="skipped", reason="returns memory it never wrote")
        return rec
    try:
        ref = _eager(op, flat, tensors)
        again = _eager(op, flat, tensors)
    except Exception as exc:  # noqa: BLE001
        rec.update(outcome="skipped", reason="eager raises on the sample: %s" %
                   _first_line("%s: %s" % (type(exc).__name__, exc)))
        return rec
    if ref is None:
        rec.update(outcome="skipped", reason="a result that is not tensors")
        return rec
    if any(r.is_complex() or r.dtype in (torch.bfloat16,) or r.layout != torch.strided
           for r in ref):
        rec.update(outcome="skipped", reason="a complex or non-strided result")
        return rec
    if not _same(ref, again):
        rec.update(outcome="skipped", reason="random: two eager calls differ")
        return rec

    if leapp is None:
        import leapp
    from leapp import annotate
    # Distinct tensors become distinct ports; a tensor passed twice is one port.
    ports, order = {}, []
    for t in tensors:
        if id(t) not in ports:
            ports[id(t)] = "x%d" % len(ports)
        order.append(ports[id(t)])
    names = list(dict.fromkeys(order))
    first = {}
    for name, t in zip(order, tensors):
        first.setdefault(name, t)
    save = os.path.join(workdir, "bundle")
    stage = "annotate"
    try:
        leapp.start(GRAPH, save_path=save)
        try:
            payload = {n: first[n].clone() for n in names}
            traced = annotate.input_tensors(NODE, payload)
            if len(names) == 1:
                traced = (traced,)
            by_name = dict(zip(names, traced))
            stage = "trace"
            with torch.no_grad():
                out = call(op, leaves, spec, positions, [by_name[n] for n in order])
            outs = flatten_outputs(out)
            stage = "annotate"
            if outs is None or len(outs) != len(ref):
                raise RuntimeError("the traced call returned %s where eager returns %d "
                                   "tensors" % (type(out).__name__, len(ref)))
            out_names = ["y%d" % i for i in range(len(outs))]
            annotate.output_tensors(NODE, dict(zip(out_names, outs)), export_with="onnx")
        finally:
            leapp.stop()
        stage = "compile"
        leapp.compile_graph(**_compile_kwargs(leapp))
    except Exception as exc:  # noqa: BLE001  the outcome under test
        message = "%s: %s" % (type(exc).__name__, exc)
        rec.update(outcome="trace_error" if stage == "trace" else "refused", stage=stage,
                   reason=_first_line(message), message=message[:3000],
                   traceback=traceback.format_exc(limit=-4)[-2000:])
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        return rec
    bundle = os.path.join(save, GRAPH)
    onnx_files, log_text = _bundle_files(bundle)
    found = re.search(re.escape(FELL_BACK) + r":? ?(.*)", log_text)
    if found:
        rec["fell_back"] = _first_line(found.group(1)) or "yes"
    if not onnx_files:
        rec.update(outcome="refused", stage="compile", reason="no .onnx file in the bundle")
        return rec
    try:
        import onnx
        rec["writer"] = onnx.load(onnx_files[0], load_external_data=False).producer_name
    except Exception:  # noqa: BLE001
        rec["writer"] = "?"
    try:
        sess = ort_session(onnx_files[0])
    except Exception as exc:  # noqa: BLE001  validated, yet onnxruntime cannot load it
        rec.update(outcome="wrong", failures=[{"input": "load", "diff": _first_line(
            "onnxruntime cannot load the model: %s" % exc)}])
        return rec
    failures = []
    for kind, inputs in input_kinds(tensors, "%s|%s|%d" % (rec["op"], dtype, index)):
        try:
            expected = _eager(op, flat, inputs)
        except Exception:  # noqa: BLE001  eager refuses this input: not checked
            continue
        if expected is None or len(expected) != len(ref):
            continue
        port_values = {}
        for name, t in zip(order, inputs):
            port_values.setdefault(name, t)
        try:
            got = sess.run(None, feeds(sess, names, [port_values[n] for n in names]))
        except Exception as exc:  # noqa: BLE001  eager accepts it, the model does not
            said = {"input": kind, "diff": _first_line(
                "onnxruntime raises: %s" % " ".join(str(exc).split()))}
            rec["checked"] += 1
            if kind == "sample" or kind.startswith("redraw"):
                failures.append(said)  # an ordinary input the model fails on
            else:  # loud, not silent (an index beyond its dimension: onnxruntime
                # raises, some eager kernels read whatever memory lies there)
                rec.setdefault("raises", []).append(said)
            continue
        rec["checked"] += 1
        got = _outputs_in_order(sess, got, out_names)
        if len(got) != len(expected):
            failures.append({"input": kind, "diff": "%d outputs where eager gives %d" % (
                len(got), len(expected))})
            continue
        ref64 = None
        overflow = 0.0
        if kind.startswith("large"):
            overflow = max([LARGE.get(str(t.dtype).replace("torch.", ""), 0.0)
                            for t in inputs if t.is_floating_point()] or [0.0])
        elif kind.startswith("int_"):  # integers of up to 2**63 in a float result
            overflow = max([float(t.double().abs().max()) for t in inputs
                            if t.numel() and not t.is_floating_point() and t.dtype != torch.bool]
                           or [0.0])
        for k, (e, g) in enumerate(zip(expected, got)):
            if k == 1 and op.name in TIE_ORDERED and _selects_the_same(inputs[0], g,
                                                                        expected[0]):
                continue
            if kind.startswith(("posinf", "neginf", "mixed")):
                e, g = _eager_nan_left_out(e, g, only_infinite=kind.startswith("mixed"))
            if overflow and e.is_floating_point():
                diff = compare(e, g, overflow=overflow)
                if diff is not None:
                    failures.append({"input": kind, "output": out_names[k], "diff": diff})
                    break
                continue
            diff = compare(e, g)
            if diff is not None and e.is_floating_point() and "beyond" in diff:
                if ref64 is None:
                    ref64 = _eager64(op, flat, inputs) or []
                diff = compare(e, g, ref64[k] if k < len(ref64) else None)
            if diff is not None:
                failures.append({"input": kind, "output": out_names[k], "diff": diff})
                break
    rec["failures"] = failures
    if failures and TORCH_MODEL_DIFFERS in log_text:
        rec["outcome"] = "warned"  # the compile named the difference: not silent
    elif failures:
        rec["outcome"] = "wrong"
    elif rec["fell_back"]:
        rec["outcome"] = "fell_back"
    else:
        rec["outcome"] = "exact"
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    return rec


def op_samples(op, dtype, limit):
    """Up to ``limit`` drivable samples of ``op`` for ``dtype`` (skipped ones counted
    apart, at most ``limit`` of them): [(index, sample)]."""
    import torch
    chosen, skipped = [], 0
    try:
        it = op.sample_inputs("cpu", _dtype(dtype), requires_grad=False)
        for index, sample in enumerate(it):
            flat, _ = flatten_sample(sample)
            if flat is None:
                if skipped < limit:
                    chosen.append((index, sample))
                skipped += 1
            else:
                chosen.append((index, sample))
            if sum(1 for i, s in chosen if flatten_sample(s)[0] is not None) >= limit:
                break
            if index >= 8 * limit + 8:
                break
    except Exception as exc:  # noqa: BLE001  OpInfo's own generator failed
        return [], "sample_inputs raises: %s" % _first_line("%s: %s" % (type(exc).__name__,
                                                                        exc))
    del torch
    return chosen, None


def run_op(op, dtypes, limit, done=(), on_begin=None, on_record=None):
    """Every chosen sample of ``op`` for ``dtypes``: [record]."""
    import torch
    records = []
    supported = {str(d).replace("torch.", "") for d in op.supported_dtypes("cpu")}
    for dtype in dtypes:
        if dtype not in supported:
            continue
        samples, why = op_samples(op, dtype, limit)
        if why:
            rec = dict(_base(op, dtype, -1), outcome="skipped", reason=why)
            records.append(rec)
            if on_record:
                on_record(rec)
            continue
        for index, sample in samples:
            if (op_key(op), dtype, index) in done:
                continue
            if on_begin:
                on_begin(op_key(op), dtype, index)
            workdir = tempfile.mkdtemp(prefix="leapp-opinfo-")
            torch.manual_seed(0)
            try:
                rec = run_sample(op, dtype, index, sample, workdir)
            except Exception as exc:  # noqa: BLE001  a harness failure, kept visible
                rec = {**_base(op, dtype, index), "outcome": "trace_error", "stage": "harness",
                       "reason": _first_line("%s: %s" % (type(exc).__name__, exc)),
                       "traceback": traceback.format_exc(limit=-4)[-2000:]}
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            records.append(rec)
            if on_record:
                on_record(rec)
    return records


# --------------------------------------------------------------------------
# Worker and orchestrator

def select_ops(db, ops=None, shard=None, reverse=False):
    chosen = []
    wanted = None if not ops else [o.strip() for o in ops.split(",") if o.strip()]
    for i, op in enumerate(db):
        key = op_key(op)
        if wanted is not None and key not in wanted and op.name not in wanted:
            continue
        if shard is not None:
            k, n = shard
            if i % n != k:
                continue
        chosen.append(op)
    # A fixed order that mixes the families, so that a run cut short (--census-only
    # on its lines) is a fair sample of the database.
    return sorted(chosen, key=lambda op: zlib.crc32(op_key(op).encode()), reverse=reverse)


# A worker's data segment: eager given a wide integer as a size (bincount, one_hot,
# repeat_interleave) asks for gigabytes; capped, the allocation raises (the input is
# then not checked) instead of the machine's OOM killer ending the worker.
WORKER_MEMORY = 6 << 30


def limit_memory(limit=WORKER_MEMORY):
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (ImportError, ValueError, OSError):  # not on this platform: unbounded
        pass


def worker(args):
    """Run the chosen ops, one JSON line per sample begun and finished."""
    limit_memory()
    import logging
    import warnings
    warnings.simplefilter("ignore")
    os.environ.setdefault("TQDM_DISABLE", "1")
    logging.getLogger("torch").setLevel(logging.ERROR)
    import torch
    torch.set_num_threads(1)
    db = load_op_db()
    ops = select_ops(db, args.ops, parse_shard(args.shard), args.reverse)
    done = set()
    if os.path.exists(args.worker):
        with open(args.worker) as f:
            for line in f:
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if "outcome" in d:
                    done.add((d["op"], d["dtype"], d["index"]))
    out = open(args.worker, "a")

    def begin(key, dtype, index):
        out.write(json.dumps({"begin": key, "dtype": dtype, "index": index}) + "\n")
        out.flush()

    def record(rec):
        out.write(json.dumps(rec) + "\n")
        out.flush()

    dtypes = args.dtypes.split(",")
    for op in ops:
        run_op(op, dtypes, args.limit_per_op, done, begin, record)
    out.write(json.dumps({"finished": True}) + "\n")
    out.close()


def parse_shard(text):
    if not text:
        return None
    k, n = text.split("/")
    return int(k), int(n)


def _read_lines(path):
    lines = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    pass
    return lines


def orchestrate(args):
    """Workers (restarted after a crash or hang) until every chosen sample has a record."""
    sys.path.insert(0, HERE)
    import compat
    python = compat.resolve_python(os.path.abspath(args.python)) if args.python else \
        sys.executable
    if not python:
        sys.exit("no interpreter at %s" % args.python)
    env = compat.clean_env(ours=not args.python)
    env["TQDM_DISABLE"] = "1"
    # A refused node's survey of the other backends (ours only) costs up to a minute
    # per sample and changes no outcome here.
    env.setdefault("LEAPP_SURVEY_SECONDS", "0")
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    lines_path = out + ".lines"
    if not (args.resume or args.census_only) and os.path.exists(lines_path):
        os.remove(lines_path)
    log_path = out + ".worker.log"
    meta = describe(python, env)
    meta.update({"dtypes": args.dtypes, "limit_per_op": args.limit_per_op, "ops": args.ops,
                 "shard": args.shard, "writer_env": os.environ.get("LEAPP_ONNX_WRITER", "")})
    t0 = time.time()
    restarts = 0
    while not args.census_only:
        argv = [python, os.path.abspath(__file__), "--worker", lines_path,
                "--dtypes", args.dtypes, "--limit-per-op", str(args.limit_per_op)]
        if args.ops:
            argv += ["--ops", args.ops]
        if args.shard:
            argv += ["--shard", args.shard]
        if args.reverse:
            argv.append("--reverse")
        with open(log_path, "a") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=tempfile.gettempdir())
            last_size, last_change = -1, time.time()
            hung = False
            while proc.poll() is None:
                time.sleep(1.0)
                size = os.path.getsize(lines_path) if os.path.exists(lines_path) else 0
                if size != last_size:
                    last_size, last_change = size, time.time()
                    if not args.quiet:
                        _progress(lines_path)
                elif time.time() - last_change > args.timeout:
                    proc.kill()
                    proc.wait()
                    hung = True
        lines = _read_lines(lines_path)
        if lines and lines[-1].get("finished"):
            break
        # The sample begun last and never finished is the one that crashed (or hung).
        begun = [d for d in lines if "begin" in d]
        finished = {(d["op"], d["dtype"], d["index"]) for d in lines if "outcome" in d}
        open_ = [d for d in begun if (d["begin"], d["dtype"], d["index"]) not in finished]
        if not open_:
            if restarts > 3:
                sys.exit("the worker fails before its first sample; see %s" % log_path)
            restarts += 1
            continue
        d = open_[-1]
        with open(lines_path, "a") as f:
            f.write(json.dumps({
                "op": d["begin"], "dtype": d["dtype"], "index": d["index"],
                "outcome": "crashed", "family": None,
                "reason": "the worker hung for %d s" % args.timeout if hung else
                "the worker died (exit %s)" % proc.returncode}) + "\n")
    records, seen = [], set()
    for path in [lines_path] + list(args.merge or []):
        for d in _read_lines(path):
            key = (d.get("op"), d.get("dtype"), d.get("index"))
            if "outcome" in d and key not in seen:
                seen.add(key)
                records.append(d)
    census = build_census(records, meta)
    census["meta"]["seconds"] = round(time.time() - t0, 1)
    lines = _read_lines(lines_path)
    census["meta"]["complete"] = bool(lines and lines[-1].get("finished")) or any(
        (lambda ls: bool(ls and ls[-1].get("finished")))(_read_lines(p))
        for p in args.merge or []) or (args.census_only and _covered(args, records))
    with open(out, "w") as f:
        json.dump(census, f, indent=1)
    if not args.quiet:
        sys.stdout.write("\n")
    print(summary_table(census))
    return census


def _covered(args, records):
    """Whether the records hold every chosen op that has one of the chosen dtypes (runs
    joined with --merge that met in the middle)."""
    wanted = set(args.dtypes.split(","))
    ops = {op_key(op) for op in select_ops(load_op_db(), args.ops, parse_shard(args.shard))
           if wanted & {str(d).replace("torch.", "") for d in op.supported_dtypes("cpu")}}
    return ops <= {r["op"] for r in records}


def _progress(lines_path):
    lines = _read_lines(lines_path)
    n = sum(1 for d in lines if "outcome" in d)
    last = next((d for d in reversed(lines) if "outcome" in d), None)
    if last:
        sys.stdout.write("\r[opinfo] %d samples, last %s %s: %s          " % (
            n, last["op"], last["dtype"], last["outcome"]))
        sys.stdout.flush()


def describe(python, env):
    code = ("import json, os, torch, leapp\n"
            "from importlib import metadata\n"
            "try: v = metadata.version('leapp')\n"
            "except Exception: v = getattr(leapp, '__version__', '?')\n"
            "print(json.dumps({'leapp': v, 'torch': torch.__version__}))")
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env,
                              cwd=tempfile.gettempdir(), timeout=300)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001
        return {"error": str(exc)}


# --------------------------------------------------------------------------
# Census and reports

def _family_of(records, key):
    for r in records:
        if r.get("op") == key and r.get("family"):
            return r["family"]
    return "other"


def build_census(records, meta):
    ops, families = {}, {f: _empty_counts() for f in FAMILIES}
    for r in records:
        if r.get("kind"):
            r["family"] = family_of(r.get("name") or r["op"].split(".")[0], r["kind"])
        if not r.get("family"):
            r["family"] = _family_of(records, r["op"])
        o = ops.setdefault(r["op"], {"family": r["family"], **_empty_counts()})
        for counts in (o, families.setdefault(r["family"], _empty_counts())):
            counts[r["outcome"]] += 1
            counts["samples"] += 1
            if r.get("writer") == "leapp":
                counts["written"] += 1
            if r.get("writer"):
                counts["exported"] += 1
            if r.get("fell_back"):
                counts["fallbacks"] += 1
    for o in ops.values():
        o["verdict"] = next((k for k in ("wrong", "trace_error", "crashed", "refused",
                                         "fell_back", "exact") if o[k]), "skipped")
    total = _empty_counts()
    for counts in families.values():
        for k in total:
            total[k] += counts[k]
    return {"meta": meta, "samples": records, "ops": ops, "families": families,
            "total": total}


def _empty_counts():
    return {k: 0 for k in ("samples", "exported", "written") + OUTCOMES + ("fallbacks",)}


def summary_table(census):
    rows = ["| family | samples | exported | written by leapp | fell back | refused | exact "
            "| wrong | trace error | crashed | skipped |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    fams = dict(census["families"])
    fams["all"] = census["total"]
    for name, c in fams.items():
        if not c["samples"]:
            continue
        rows.append("| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d |" % (
            name, c["samples"], c["exported"], c["written"], c["fallbacks"], c["refused"],
            c["exact"] + c["fell_back"], c["wrong"], c["trace_error"], c["crashed"],
            c["skipped"]))
    return "\n".join(rows)


def wrong_list(census, outcomes=("wrong", "trace_error", "crashed")):
    """[(op, dtype, index, outcome, input kind, diff)] of the failing samples."""
    out = []
    for r in census["samples"]:
        if r["outcome"] not in outcomes:
            continue
        if r["outcome"] == "wrong":
            f = r["failures"][0]
            out.append((r["op"], r["dtype"], r["index"], "wrong", f["input"], f["diff"]))
        else:
            out.append((r["op"], r["dtype"], r["index"], r["outcome"], r.get("stage", ""),
                        r.get("reason", "")))
    return out


def _label(census, default):
    m = census.get("meta", {})
    return m.get("label") or default


def markdown(censuses):
    """docs/backends.md's op-database section, from one to three censuses."""
    labels = [_label(c, d) for c, d in zip(censuses, ("ours", "torch's exporter",
                                                       "upstream 0.7.2"))]
    first = censuses[0]["meta"]
    lines = [
        "<!-- generated by bench/opinfo.py --markdown; do not edit by hand -->",
        "",
        "Run: up to %s samples per op and dtype, torch %s. Columns per family: "
        "samples driven (skipped ones apart), exported, written by leapp's ONNX writer, "
        "fell back to torch's exporter, refused, exact on every input (fell back ones "
        "included), silently wrong on some input, warned (different on some input, and the "
        "compile said so at WARNING), trace errors."
        % (first.get("limit_per_op"), first.get("torch", "?")),
        ""]
    head = "| family | " + " | ".join(
        "%s: %s" % (lab, col) for lab in labels
        for col in ("driven", "exported", "written", "fell back", "refused", "exact", "wrong",
                    "trace error"))
    # One table per side keeps the lines readable.
    for census, lab in zip(censuses, labels):
        meta = census["meta"]
        lines.append("**%s** (leapp %s, %s%s%s)" % (
            lab, meta.get("leapp", "?"), ", ".join(sorted({r["dtype"] for r in census["samples"]},
                                                          key=DTYPES.index)),
            ", LEAPP_ONNX_WRITER=" + meta["writer_env"] if meta.get("writer_env") else "",
            "" if meta.get("complete", True) else
            ", a run cut short: %d ops of the database" % len(census["ops"])))
        lines.append("")
        lines.append("| family | driven | exported | written | fell back | refused | exact "
                     "| wrong | warned | trace error | crashed |")
        lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                     "| ---: |")
        fams = dict(census["families"])
        fams["all"] = census["total"]
        for name, c in fams.items():
            driven = c["samples"] - c["skipped"]
            if not driven:
                continue
            lines.append("| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d |" % (
                name, driven, c["exported"], c["written"], c["fallbacks"], c["refused"],
                c["exact"] + c["fell_back"], c["wrong"], c.get("warned", 0), c["trace_error"],
                c["crashed"]))
        lines.append("")
    del head
    if len(censuses) > 1:
        lines += common_lines(censuses, labels)
        lines += comparison_lines(censuses, labels)
    wrong = wrong_list(censuses[0])
    lines.append("Silently wrong, trace errors and crashes with %s (op, dtype, sample, "
                 "input, difference):" % labels[0])
    lines.append("")
    if not wrong:
        lines.append("none.")
    grouped = {}
    for op, dtype, index, outcome, kind, diff in wrong:
        grouped.setdefault((op, dtype, outcome), []).append((index, kind, diff))
    for (op, dtype, outcome), items in grouped.items():
        index, kind, diff = items[0]
        lines.append("- `%s` %s (sample%s %s): %s on `%s`: %s" % (
            op, dtype, "s" if len(items) > 1 else "",
            ", ".join("#%s" % i for i, _, _ in items), outcome, kind, _mask(diff)))
    lines.append("")
    return "\n".join(lines)


BEGIN = "<!-- opinfo:begin -->"
END = "<!-- opinfo:end -->"


def write_docs(path, text):
    """The generated section between BEGIN and END of ``path`` replaced by ``text``."""
    with open(path) as f:
        doc = f.read()
    start, stop = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    with open(path, "w") as f:
        f.write(doc[:start] + "\n" + text.rstrip("\n") + "\n" + doc[stop:])


def common_lines(censuses, labels):
    """Per family, on the samples every side drove: exact / wrong / refused of each."""
    sides = [_by_sample(c) for c in censuses]
    keys = set(sides[0])
    for side in sides[1:]:
        keys &= set(side)
    keys = {k for k in keys if all(s[k]["outcome"] != "skipped" for s in sides)}
    lines = ["On the %d samples every side drove, exact / silently wrong / warned (a "
             "difference the compile named) / refused (trace errors and crashes apart):"
             % len(keys), "",
             "| family | " + " | ".join(labels) + " |", "| --- |" + " ---: |" * len(labels)]
    for fam in FAMILIES + ("all",):
        cells, n = [], 0
        for side in sides:
            rows = [side[k] for k in keys if fam == "all" or side[k]["family"] == fam]
            n = len(rows)
            count = {o: sum(1 for r in rows if r["outcome"] == o) for o in OUTCOMES}
            cells.append("%d / %d / %d / %d" % (count["exact"] + count["fell_back"],
                                                count["wrong"], count["warned"],
                                                count["refused"]))
        if n:
            lines.append("| %s (%d) | %s |" % (fam, n, " | ".join(cells)))
    lines.append("")
    return lines


def _by_sample(census):
    return {(r["op"], r["dtype"], r["index"]): r for r in census["samples"]}


def comparison_lines(censuses, labels):
    """Samples where the first side is not exact and another side is."""
    base = _by_sample(censuses[0])
    others = [_by_sample(c) for c in censuses[1:]]
    good = ("exact", "fell_back")
    lines = ["Where %s is not exact and %s is (op, dtype, sample: outcome of each):" % (
        labels[0], " or ".join(labels[1:])), ""]
    n = 0
    for key, r in sorted(base.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        if r["outcome"] in good or r["outcome"] == "skipped":
            continue
        theirs = [o.get(key) for o in others]
        if not any(t is not None and t["outcome"] in good for t in theirs):
            continue
        n += 1
        lines.append("- `%s` %s #%s: %s" % (key[0], key[1], key[2], ", ".join(
            "%s %s" % (lab, (rr or {}).get("outcome", "not run"))
            for lab, rr in zip(labels, [r] + theirs))) + (
            " (%s)" % _first_failure(r)))
    if not n:
        lines.append("none.")
    lines.append("")
    return lines


def _mask(text):
    """A message as the docs show it: no machine paths (a file keeps its name), no pipes."""
    text = re.sub(r"(?:/[\w.+-]+)+/([\w.+-]+\.py)", r"\1", text or "")
    text = re.sub(r"(?:/[\w.+-]+){2,}", "<path>", text)
    return text.replace("|", "/")


def _first_failure(r):
    if r["outcome"] == "wrong":
        f = r["failures"][0]
        return "%s: %s" % (f["input"], _mask(f["diff"]))
    return _mask(r.get("reason"))[:200]


def compare_report(censuses):
    """The three-way report of ``make opinfo``: per family side by side, then per op where
    the sides' verdicts differ."""
    labels = [_label(c, d) for c, d in zip(censuses, ("ours", "torch's exporter",
                                                       "upstream 0.7.2"))]
    lines = ["# OpInfo census: %s" % ", ".join(labels), ""]
    for c, lab in zip(censuses, labels):
        m = c["meta"]
        lines.append("- %s: leapp %s, torch %s, dtypes %s, %s per op and dtype, %s s" % (
            lab, m.get("leapp"), m.get("torch"), m.get("dtypes"), m.get("limit_per_op"),
            m.get("seconds")))
    lines += ["", "| family | " + " | ".join("%s exact / wrong / refused / fell back" % lab
                                           for lab in labels) + " |",
              "| --- |" + " --- |" * len(labels)]
    for fam in FAMILIES + ("all",):
        cells = []
        for c in censuses:
            k = c["total"] if fam == "all" else c["families"].get(fam, _empty_counts())
            cells.append("%d / %d / %d / %d" % (k["exact"] + k["fell_back"], k["wrong"],
                                                 k["refused"], k["fallbacks"]))
        lines.append("| %s | %s |" % (fam, " | ".join(cells)))
    lines += ["", "## Ops whose verdicts differ", "", "| op | " + " | ".join(labels) + " |",
              "| --- |" + " --- |" * len(labels)]
    keys = sorted(set().union(*[c["ops"] for c in censuses]))
    for key in keys:
        verdicts = [c["ops"].get(key, {}).get("verdict", "not run") for c in censuses]
        if len(set(verdicts)) > 1:
            lines.append("| `%s` | %s |" % (key, " | ".join(verdicts)))
    lines.append("")
    lines += comparison_lines(censuses, labels)
    for c, lab in zip(censuses, labels):
        lines += ["## Silently wrong with %s" % lab, ""]
        wrong = wrong_list(c, ("wrong",))
        lines += ["- `%s` %s #%s: on `%s`: %s" % (op, dt, ix, kind, _mask(diff))
                  for op, dt, ix, _, kind, diff in wrong] or ["none."]
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", help="comma-separated op names (OpInfo name or name.variant)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--limit-per-op", type=int, default=2, help="samples per op and dtype")
    ap.add_argument("--shard", help="K/N: the ops whose index in op_db is K modulo N")
    ap.add_argument("--out", default="build/opinfo/census.json")
    ap.add_argument("--label", help="the side's name in the reports")
    ap.add_argument("--python", help="run the workers under this interpreter or venv "
                                     "(upstream's side)")
    ap.add_argument("--timeout", type=int, default=600,
                    help="seconds without a finished sample before a worker is killed")
    ap.add_argument("--resume", action="store_true", help="keep the records of a previous run")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--reverse", action="store_true",
                    help="the ops in the opposite order (a second process on the same "
                         "side; --census-only --merge joins the two)")
    ap.add_argument("--merge", nargs="+", metavar="LINES",
                    help="with --census-only: the records of these runs' OUT.lines too")
    ap.add_argument("--census-only", action="store_true",
                    help="no run: the census of the records a previous run left (OUT.lines)")
    ap.add_argument("--markdown", nargs="+", metavar="CENSUS",
                    help="print docs/backends.md's section from these censuses")
    ap.add_argument("--write-docs", metavar="MD",
                    help="with --markdown: replace the section between the opinfo "
                         "markers of this file (docs/backends.md)")
    ap.add_argument("--compare", nargs="+", metavar="CENSUS",
                    help="the comparison report of these censuses (to --report)")
    ap.add_argument("--report", help="where --compare writes (default: stdout)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.markdown:
        text = markdown([_load(p) for p in args.markdown])
        if args.write_docs:
            write_docs(args.write_docs, text)
            print("[opinfo] %s: section rewritten" % args.write_docs)
        else:
            print(text)
        return 0
    if args.compare:
        text = compare_report([_load(p) for p in args.compare])
        if args.report:
            with open(args.report, "w") as f:
                f.write(text)
            print("[opinfo] report: %s" % args.report)
        else:
            print(text)
        return 0
    census = orchestrate(args)
    if args.label:
        census["meta"]["label"] = args.label
        with open(os.path.abspath(args.out), "w") as f:
            json.dump(census, f, indent=1)
    return 0


def _load(path):
    """A census, its counts built again from its samples (the families as this file
    draws them)."""
    with open(path) as f:
        census = json.load(f)
    return build_census(census["samples"], census["meta"])


if __name__ == "__main__":
    sys.exit(main())
