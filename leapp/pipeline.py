"""The public import path `leapp.pipeline`: The pipeline of a bundle as one typed, immutable model.

# --- public path only --------------------------------------------------------
# The code lives in leapp/bundle/pipeline.py (the bundle stage); this module
# only keeps `leapp.pipeline` importable.  Add nothing here.
"""
from .bundle.pipeline import (  # noqa: F401
    DOCUMENTS, DTYPES, Edge, Node, OUTPUT_KEY, Pipeline, Port, check_name, dtype_name,
    join_key, split_key, torch_dtype,
)

__all__ = [
    "DOCUMENTS", "DTYPES", "Edge", "Node", "OUTPUT_KEY", "Pipeline", "Port", "check_name",
    "dtype_name", "join_key", "split_key", "torch_dtype",
]
