"""Bring your own model: export_with=None, optionally backend_params["model_path"].

Without a model path the node is described in the YAML only (null model path
and backend).  With one, the pre-compiled file is loaded in its runtime so that
validation runs it against the traced values, and the bundle gets it:

* a file already inside the bundle directory is referenced where it is;
* a file outside it is copied into the bundle, so that the bundle is
  self-contained (``InferenceManager`` refuses paths leaving the bundle);
* ``copy_original_model=True`` always copies; ``copy_original_model=False``
  keeps referencing a file outside the bundle (with a warning: such a bundle
  only loads with ``InferenceManager(..., allow_external_paths=True)``).
"""
from __future__ import annotations

import os
import shutil

import torch

from ...bundle.log import logger
from . import ExportContext, Exported
from ...models.load import load

# file suffix -> YAML backend
SUFFIX_BACKENDS = {".pt": "jit", ".onnx": "onnx", ".pt2": "pt2"}


def _inside_bundle(path: str, bundle: str) -> bool:
    """Whether path lies (after symlinks) inside the bundle directory being written."""
    root = os.path.realpath(bundle)
    real = os.path.realpath(path)
    return real.startswith(root.rstrip(os.sep) + os.sep)


def export(node: str, name: str | None, params: dict, module: torch.fx.GraphModule,
           example_inputs: list[torch.Tensor], input_names: list[str],
           output_names: list[str], out_dir: str, context: ExportContext) -> Exported:
    """Reference (or copy) the user's model file; nothing is exported."""
    model_path = params.get("model_path")
    if model_path is None:
        logger.warning("No model path provided for %s", node)
        logger.warning("if this is intentional, please provide a path to the correct model in "
                       "the generated yaml file (models/%s/parameters/model_path and backend), "
                       "or pass export_with=... or backend_params={'model_path': ...} to "
                       "output_tensors() for node %s", node, node)
        return Exported(model=None, path=None, yaml_backend=None, input_names=input_names,
                        output_names=output_names)
    model_path = os.fspath(model_path)
    suffix = os.path.splitext(model_path)[1].lower()
    backend = SUFFIX_BACKENDS.get(suffix)
    if backend is None:
        raise ValueError(
            f"[{node}] Unsupported model file suffix: {suffix or '(none)'} in model_path "
            f"{model_path!r}; use one of {sorted(SUFFIX_BACKENDS)} (TorchScript .pt, ONNX "
            f".onnx, torch.export .pt2)")
    if not os.path.isfile(model_path):
        raise FileNotFoundError(f"[{node}] Model file not found at {model_path} "
                                f"(backend_params['model_path'], resolved to "
                                f"{os.path.abspath(model_path)})")
    path = os.path.abspath(model_path)
    copy = params.get("copy_original_model")
    inside = _inside_bundle(path, context.bundle_dir)
    if copy or (copy is None and not inside):
        copied = os.path.join(out_dir, os.path.basename(path))
        if os.path.exists(copied):  # another node's file already has that name
            copied = os.path.join(out_dir, f"{node}_{os.path.basename(path)}")
        shutil.copy2(path, copied)
        if suffix == ".onnx" and os.path.isfile(path + ".data"):
            shutil.copy2(path + ".data", copied + ".data")
        if not copy:
            logger.info("[%s] %s lies outside the bundle directory: copied into the bundle "
                        "as %s", node, path, os.path.basename(copied))
        path = copied
    elif not inside:
        logger.warning("[%s] copy_original_model=False: the bundle references %s outside its "
                       "directory; InferenceManager loads it only with "
                       "allow_external_paths=True", node, path)
    # loaded now, as InferenceManager will load it: a file it could not load fails here
    model = load(backend, path, input_names=input_names, allow_external_paths=True,
                 device="cpu")[0]
    return Exported(model=model, path=path, yaml_backend=backend,
                    input_names=input_names, output_names=output_names,
                    external=not _inside_bundle(path, context.bundle_dir))
