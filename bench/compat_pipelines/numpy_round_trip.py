"""NumPy inside nodes: round trips through numpy and back into torch.

prep (jit): torch input -> np.asarray -> ufuncs, np.concatenate, np.clip,
a reduction -> torch.from_numpy.
policy (onnx): a raw NumPy array given to input_tensors next to prep's
output (through .numpy()), np.where / np.maximum / reshape / transpose /
indexing, and a NumPy array returned to output_tensors.
post (jit): np.array of policy's output -> torch.as_tensor -> torch ops.
Three passes, so the re-entry cache feeds validation.
"""

import numpy as np
import torch

import leapp
from leapp import annotate
from _util import seeded, setup

name, out = setup(__file__)

weights = seeded(8, 4, seed=7).numpy()


def step(obs, command):
    x = annotate.input_tensors("prep", {"obs": obs})
    a = np.asarray(x)
    feats = np.concatenate([np.tanh(a * 0.5), np.clip(a, -1.0, 1.0)], axis=-1)
    feats = feats - np.mean(feats, axis=-1, keepdims=True)
    feats = annotate.output_tensors("prep", {"features": torch.from_numpy(feats)},
                                    export_with="jit")

    f, c = annotate.input_tensors("policy", {"features": feats, "command": command})
    h = f.numpy() @ weights
    h = np.maximum(h, 0.0) + np.where(c > 0.0, c, 0.1 * c)
    h = h.reshape(2, 2).T.reshape(1, 4)
    gate = np.exp(-np.abs(h[:, :2]))
    action = np.concatenate([h[:, 2:] * gate, gate], axis=1)
    action = annotate.output_tensors("policy", {"action": action}, export_with="onnx")

    y = annotate.input_tensors("post", {"action": torch.as_tensor(np.array(action))})
    y = torch.as_tensor(np.sqrt(np.square(y.numpy()) + 1.0)) * 2.0
    return annotate.output_tensors("post", {"command": y}, export_with="jit")


leapp.start(name, save_path=out)
with torch.no_grad():
    for i in range(3):
        step(seeded(1, 4, seed=i), seeded(1, 4, seed=50 + i).numpy())
leapp.stop()
leapp.compile_graph(visualize=False)
