"""In-place writes through aliases of traced values: a detach() alias scaled
in place, a whole-tensor slice written through, relu_ on a value whose
detach() alias is read afterwards, a buffer declared twice under two names
(semantics only on the second declaration), and a pass-through node, over
jit and onnx nodes with two passes."""

import torch

import leapp
from leapp import annotate
from _util import seeded, setup

name, out = setup(__file__)

layer = torch.nn.Linear(6, 6).eval()


def step(obs, buf):
    x = annotate.input_tensors("scale", {"obs": obs.clone()})
    alias = x.detach()
    alias.mul_(2.0)                      # seen through x
    whole = x[:]
    whole.add_(0.5)                      # seen through x and alias
    y = layer(x)
    keep = y.detach()
    torch.relu_(y)                       # seen through keep
    y = annotate.output_tensors("scale", {"y": keep * 1.0}, export_with="jit")

    same_buf = buf.view_as(buf)          # a second object over buf's memory
    a, _ = annotate.input_tensors("mix", {"a": y, "buf": buf})
    again = annotate.input_tensors("mix", leapp.TensorSemantics(
        name="buf_again", ref=same_buf, kind=leapp.InputKindEnum.JOINT_POSITION))
    row = a[:]
    row.sub_(again)
    return annotate.output_tensors("mix", {"out": a + 1.0}, export_with="onnx")


leapp.start(name, save_path=out)
with torch.no_grad():
    buf = torch.linspace(-1.0, 1.0, 6).reshape(1, 6)
    for i in range(2):
        step(seeded(1, 6, seed=i), buf)
leapp.stop()
leapp.compile_graph(visualize=False)
