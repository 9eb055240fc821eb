"""Validation of exported nodes against the values seen while tracing."""
from __future__ import annotations

from typing import Any

import torch

from ._logging import fatal, logger, section


def validate_models(entries: list, rtol: float, atol: float, strict: bool) -> dict:
    """entries: (node, model or None, input ports, output ports) -> {node: result}."""
    results: dict[str, Any] = {}
    section(f"Validating {len(entries)} models")
    for name, model, inputs, outputs in entries:
        logger.info("Validating %s...", name)
        if model is None:
            logger.warning("Model %s does not have a compiled model. Skipping validation.", name)
            results[name] = True
            continue
        try:
            with torch.no_grad():
                got = model(*[p.value for p in inputs])
            got = got if isinstance(got, (tuple, list)) else (got,)
            results[name] = len(got) == len(outputs) and all(
                torch.allclose(g.to(p.value.device), p.value, rtol=rtol, atol=atol)
                for g, p in zip(got, outputs))
        except Exception as exc:
            logger.error("%s: Validation failed with exception: %s", name, exc)
            results[name] = exc
    failed = [n for n, r in results.items() if r is not True]
    if strict and failed:
        fatal(f"Model validation failed for {len(failed)} node(s): {failed}", Exception)
    return results
