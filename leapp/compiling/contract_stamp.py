"""Writing the contract into every exported model of a compile (before the bundle's
checksums); the contract itself is leapp.bundle.contract."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..bundle.contract import initial_values, node_contract, write
from ..bundle.log import logger


def stamp_compiled(graph: str, nodes: list, exported: Mapping[str, Any], pipeline: dict,
                   staging: str, cache: Any, system_information: dict,
                   ports: Mapping[str, Mapping[str, list]]) -> None:
    """Write each exported model's contract into the staged bundle (before its checksums).

    The contract is built from the pipeline model of the documents the YAML is
    written from, so :func:`expected` on the committed bundle gives the same
    (tests/test_contract.py compares the two for every backend).  Files an export reused keep their manifest entry's
    checksum in step (``leapp.compiling.incremental``).  ``ports``: each node's YAML
    ``inputs`` and ``outputs``, with the exporters' renames applied.
    """
    from ..bundle.pipeline import Pipeline
    from ..tracing.annotations import info
    from .incremental import file_sha256
    stamped = [n for n in nodes if n.name in exported and exported[n.name].path
               and not exported[n.name].external and info(n).export_with is not None
               and exported[n.name].yaml_backend in ("onnx", "jit", "pt2")
               and os.path.dirname(os.path.abspath(exported[n.name].path)) == staging]
    if not stamped:
        return
    models = {}
    for node in nodes:
        result = exported.get(node.name)
        models[node.name] = {
            "inputs": ports[node.name]["inputs"],
            "outputs": ports[node.name]["outputs"],
            "parameters": {"model_path": None, "md5sum": None, "sha256sum": None,
                           "backend": None if result is None else result.yaml_backend}}
    model = Pipeline.from_compile(models, pipeline, system_information)
    initial = initial_values(model, staging)
    for node in stamped:
        result = exported[node.name]
        if write(result.path, node_contract(model, graph, node.name, initial)):
            entry = cache.entries.get(node.name)
            if entry is not None and os.path.basename(result.path) in entry["files"]:
                entry["files"][os.path.basename(result.path)] = file_sha256(result.path)
    logger.debug("Contracts written into %d model files", len(stamped))
