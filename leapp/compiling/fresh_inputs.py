"""Inputs the trace never drew: the check of an exported node beyond its traced values.

Validation compares an exported node with eager on the traced inputs only, and a
rule that mishandles a NaN (a missing height-scan ray), an infinity, a negative
zero, a large magnitude or an integer that wraps passes it and computes
something else on the robot.  `draws` derives fresh inputs from the traced
ones, of the same shapes and dtypes:

- "perturbed": floats moved by a few percent of their scale, integers redrawn
  within the range the trace saw (they may be indices), booleans redrawn;
- "NaN", "+inf", "-inf", "-0.0", "large" (1e4 in float32, 200 in float16):
  copies of the traced inputs (their other values kept: a target of ±1, a
  0 / 1 mask stay what they were) with those values at a third of the float
  positions, in three placements, so that every position holds one once (first,
  second or third in a window), each input's placement its own;
- "integer edges" and "wide integers": integers at their dtype's smallest and
  largest values, and drawn across its whole range, where the node accepts them
  (an index out of range makes eager raise: that draw is left out).

`first_difference` runs the node's fx graph (eager) and an exported model on
each draw (one eager raises on is left out, and so is an adversarial one the
export raises on: an index beyond its dimension reads memory in some eager
kernels and raises in onnxruntime, which is loud, not silent): NaN must match NaN, infinities their sign, integers and booleans
exactly, finite floats within validation's tolerance (on a draw of large or
non-finite values, relative to the largest finite magnitude of the output:
rounding grows with the values, a wrong rule does not hide in it).  On the
draws of infinities and large values, a NaN of eager's may be a number in the
export: inf - inf or inf * 0 inside a composite op (a GRU's gates) is an
accident of eager's order of operations, not a value the node means; a NaN the
export makes where eager gives a number is always a difference.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

#: validation's default tolerance (compile_graph's rtol / atol)
RTOL, ATOL = 1e-3, 1e-5

#: the magnitude of the "large" draw per float dtype: far beyond an observation's range,
#: past where exp overflows (88 in float32, 11 in float16), short of where a square or
#: a dot product of a few of them does (an attention score, a LayerNorm's variance:
#: there eager's and any export's overflow follow their own orders of operations)
_LARGE = {torch.float16: 200.0, torch.bfloat16: 1.0e4, torch.float32: 1.0e4,
          torch.float64: 1.0e8}

#: draws whose infinities make eager's own NaN an accident of its order of operations
#: (inf - inf, inf * 0 inside a GRU's gates): a number there is no difference
_OVERFLOWING = frozenset({"+inf", "-inf", "large"})

#: the placements of a kind (default three: every position special once); integer edges
#: alternate two values, a wide draw covers every position at once
_PLACEMENTS = {"integer edges": (0, 1), "wide integers": (0,)}

#: the kinds of draw, in the order they are tried
KINDS = ("perturbed", "NaN", "+inf", "-inf", "-0.0", "large", "integer edges",
         "wide integers")


@dataclass(frozen=True)
class Draw:
    """One set of fresh inputs: its kind (KINDS) and the tensors, in input order."""

    kind: str
    inputs: tuple


@dataclass(frozen=True)
class Difference:
    """Where an exported model parted from eager: the draw, the output (index and
    name) and how ('NaN where eager gives a number', 'off by 3.2', ...)."""

    draw: Draw
    output: int
    output_name: str
    detail: str

    def describe(self, input_names: Sequence[str] = ()) -> str:
        """'on an input with NaN (x, y): output 'action' is NaN where eager gives a number'."""
        touched = [n for n, t in zip(input_names, self.draw.inputs) if _touched(t, self.draw)]
        inputs = f" ({', '.join(touched)})" if touched else ""
        what = "on fresh inputs" if self.draw.kind == "perturbed" else \
            f"on an input with {self.draw.kind}"
        return f"{what}{inputs}: output '{self.output_name}' {self.detail}"


def _touched(t: Any, draw: Draw) -> bool:
    if not isinstance(t, torch.Tensor):
        return False
    if draw.kind in ("integer edges", "wide integers"):
        return not t.is_floating_point() and t.dtype != torch.bool
    return t.is_floating_point() or draw.kind == "perturbed"


def _perturbed(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    if t.is_floating_point():
        base = t.detach().to(torch.float64)
        finite = base[torch.isfinite(base)]
        scale = float(finite.abs().mean()) if finite.numel() else 1.0
        noise = torch.randn(t.shape, generator=gen, dtype=torch.float64)
        moved = base * (1 + 0.05 * noise) + 0.05 * max(scale, 1e-3) * \
            torch.randn(t.shape, generator=gen, dtype=torch.float64)
        return torch.where(torch.isfinite(base), moved, base).to(t.dtype)
    if t.dtype == torch.bool:
        return torch.rand(t.shape, generator=gen) < 0.5
    if t.is_complex() or t.numel() == 0:
        return t.detach().clone()
    low, high = int(t.min()), int(t.max())
    return torch.randint(low, high + 1, t.shape, generator=gen, dtype=torch.int64).to(t.dtype)


def _where_every_third(t: torch.Tensor, value: float, offset: int) -> torch.Tensor:
    flat = t.reshape(-1).clone()
    if flat.numel():
        flat[offset % 3::3] = value
    return flat.reshape(t.shape)


def _with(t: torch.Tensor, kind: str, offset: int) -> torch.Tensor:
    """t (a traced input) with the values of kind at a third of its positions (integers:
    at their dtype's edges, or drawn across its whole range)."""
    if kind == "wide integers":
        if t.is_floating_point() or t.dtype == torch.bool or t.is_complex():
            return t
        info = torch.iinfo(t.dtype)
        gen = torch.Generator().manual_seed(1000 + offset)
        return torch.randint(info.min, info.max, t.shape, generator=gen,
                             dtype=torch.int64).to(t.dtype)
    if kind == "integer edges":
        if t.is_floating_point() or t.dtype == torch.bool or t.is_complex():
            return t
        info = torch.iinfo(t.dtype)
        flat = t.reshape(-1).clone()
        flat[offset % 2::2] = info.max
        flat[(offset + 1) % 2::2] = info.min
        return flat.reshape(t.shape)
    if not t.is_floating_point():
        return t
    if kind == "large":
        large = _LARGE.get(t.dtype, 1.0e30)
        big = torch.where(t < 0, -large, large).to(t.dtype)
        at = _where_every_third(torch.zeros(t.shape, dtype=torch.bool), True, offset)
        return torch.where(at, big, t)
    value = {"NaN": float("nan"), "+inf": float("inf"), "-inf": float("-inf"),
             "-0.0": -0.0}[kind]
    return _where_every_third(t, value, offset)


def draws(inputs: Sequence[Any], seed: int = 0) -> list[Draw]:
    """The fresh inputs of every kind derived from the traced inputs (a kind that
    changes nothing, such as NaN for a node of integer inputs, is left out)."""
    gen = torch.Generator().manual_seed(seed)
    base = tuple(_perturbed(t, gen) if isinstance(t, torch.Tensor) else t for t in inputs)
    found = [Draw("perturbed", base)]
    traced = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in inputs)
    for kind in KINDS[1:]:
        for shift in _PLACEMENTS.get(kind, (0, 1, 2)):  # every position special once:
            # first, second or third in a window
            changed = tuple(_with(t, kind, i + shift) if isinstance(t, torch.Tensor) else t
                            for i, t in enumerate(traced))
            if any(c is not b for c, b in zip(changed, traced)):
                found.append(Draw(kind, changed))
    return found


def _outputs(result: Any) -> list:
    if isinstance(result, (tuple, list)):
        return list(result)
    if isinstance(result, dict):
        return list(result.values())
    return [result]


def compare(got: torch.Tensor, want: torch.Tensor, kind: str = "perturbed") -> str:
    """'' when got matches eager's want, else how it differs."""
    if tuple(got.shape) != tuple(want.shape):
        return f"has shape {list(got.shape)} where eager gives {list(want.shape)}"
    if got.dtype != want.dtype:
        return f"has dtype {got.dtype} where eager gives {want.dtype}"
    if not want.is_floating_point():
        if torch.equal(got, want):
            return ""
        wrong = int((got != want).sum())
        return f"differs from eager at {wrong} of {want.numel()} positions"
    got64, want64 = got.double(), want.double()
    rtol, atol = (1e-2, 1e-3) if want.dtype in (torch.float16, torch.bfloat16) else (RTOL, ATOL)
    if torch.allclose(got64, want64, rtol=rtol, atol=atol, equal_nan=True):
        return ""  # the common case in one call: NaN on NaN, equal infinities, close values
    if kind in _OVERFLOWING:  # eager's NaN from inf - inf or inf * 0: undefined there
        defined = ~torch.isnan(want64)
        got64, want64 = got64[defined], want64[defined]
    nan_got, nan_want = torch.isnan(got64), torch.isnan(want64)
    if bool((nan_got & ~nan_want).any()):
        return "is NaN where eager gives a number"
    if bool((nan_want & ~nan_got).any()):
        return "is a number where eager gives NaN"
    inf_got, inf_want = torch.isinf(got64), torch.isinf(want64)
    if bool((inf_got != inf_want).any()) or not torch.equal(got64[inf_got], want64[inf_want]):
        return "is infinite where eager is not (or of the other sign)"
    finite = ~(nan_want | inf_want)
    if not bool(finite.any()):
        return ""
    g, w = got64[finite], want64[finite]
    if kind != "perturbed":  # large or non-finite inputs: rounding grows with the values
        atol = max(atol, rtol * float(w.abs().max()))
    diff = (g - w).abs()
    if bool((diff <= atol + rtol * w.abs()).all()):
        return ""
    return f"is off by up to {float(diff.max()):.3g} (rtol {rtol:g}, atol {atol:.3g})"


def eager(module: Any, draw: Draw) -> list | None:
    """The fx module's outputs on draw (cloned inputs), or None when eager refuses it."""
    # a GraphModule's __call__ prints the traceback of an error to stderr: its forward
    call = module.forward if isinstance(module, torch.fx.GraphModule) else module
    try:
        with torch.no_grad():
            return _outputs(call(*[t.clone() if isinstance(t, torch.Tensor) else t
                                   for t in draw.inputs]))
    except Exception:  # noqa: BLE001  an input the node refuses (an index out of range)
        return None


def first_difference(module: Any, run: Callable[[Sequence[Any]], Sequence[Any]],
                     inputs: Sequence[Any], output_names: Sequence[str],
                     seed: int = 0, tie_ordered: Sequence[str] = ()) -> Difference | None:
    """The first draw on which run (an exported model: inputs -> outputs) parts from the
    fx module, or None when it agrees on every draw eager accepts.

    tie_ordered names outputs whose order among equal values is eager's kernel's and
    follows no rule (topk's indices): they are compared on the perturbed draw only,
    as the others draws make ties (NaN, -0.0 beside 0.0, ±inf)."""
    for draw in draws(inputs, seed):
        want = eager(module, draw)
        if want is None:
            continue
        try:
            got = list(run(draw.inputs))
        except Exception as exc:  # noqa: BLE001  the export refuses the input
            if draw.kind != "perturbed":
                continue  # loud, not silent: eager's result there is undefined or raises
            return Difference(draw, -1, "(all)", f"raises where eager runs: "
                                               f"{' '.join(str(exc).split())[:200]}")
        for index, (g, w) in enumerate(zip(got, want)):
            name = output_names[index] if index < len(output_names) else str(index)
            if not isinstance(w, torch.Tensor) or \
                    (draw.kind != "perturbed" and name in tie_ordered):
                continue
            detail = compare(torch.as_tensor(g).cpu(), w.detach().cpu(), draw.kind)
            if detail:
                return Difference(draw, index, name, detail)
    return None
