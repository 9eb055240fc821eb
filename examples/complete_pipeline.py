"""The API reference's worked example: preprocess -> inference -> postprocess.

    python examples/complete_pipeline.py [save_path]
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn as nn

import leapp
from leapp import annotate


class SimpleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(10, 5)

    def forward(self, x):
        return self.linear(x)


torch.manual_seed(0)
model = SimpleNet()
model.eval()


@annotate.method(export_with="jit", node_name="preprocess")
def preprocess(raw_data):
    """Normalize input data."""
    normalized = ((raw_data - raw_data.mean())
                  / (raw_data.std() + 1e-6))
    return normalized


def main(save_path: str = "./exports") -> str:
    leapp.start(
        name="complete_pipeline",
        save_path=save_path,
        verbose=True,
    )

    raw_input = torch.randn(1, 10)
    preprocessed = preprocess(raw_input)

    pred_traced = annotate.input_tensors("inference",
                                         {"features": preprocessed})
    predictions = model(pred_traced)
    annotate.output_tensors("inference",
                            {"predictions": predictions},
                            export_with="jit")

    pred_traced = annotate.input_tensors("postprocess",
                                         {"predictions": predictions})
    probabilities = torch.softmax(pred_traced, dim=1)
    final_output = torch.argmax(probabilities, dim=1)
    annotate.output_tensors("postprocess",
                            {"final_output": final_output},
                            export_with="jit")

    leapp.stop()
    leapp.compile_graph(visualize=True)
    bundle = os.path.abspath(os.path.join(save_path, "complete_pipeline"))
    print(f"Bundle written to {bundle}")
    return bundle


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "./exports")
