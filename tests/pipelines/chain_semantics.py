"""Three nodes with nested inputs, semantics, a static output and a method node."""
import sys

import torch

import leapp
from leapp import InputKindEnum, OutputKindEnum, TensorSemantics, annotate


@annotate.method(export_with="jit")
def normalise(obs):
    centered = obs - obs.mean(dim=-1, keepdim=True)
    return centered


torch.manual_seed(0)
leapp.start("chain_semantics", save_path=sys.argv[1])
q, dq = annotate.input_tensors("obs_processor", [
    TensorSemantics(name="joint_pos", ref=torch.randn(1, 3), kind=InputKindEnum.JOINT_POSITION,
                    element_names=["hip", "knee", "ankle"]),
    TensorSemantics(name="joint_vel", ref=torch.randn(1, 3), kind=InputKindEnum.JOINT_VELOCITY),
])
extra = annotate.input_tensors("obs_processor", {"cmd": {"lin": torch.randn(1, 2),
                                                         "ang": [torch.randn(1, 1)]}})
obs = torch.cat([q, dq * 0.1, extra["lin"], extra["ang"][0]], dim=-1)
annotate.output_tensors("obs_processor", {"obs": obs}, static_outputs={"scale": torch.ones(3)},
                        export_with="jit")
n = normalise(obs)
h = annotate.input_tensors("policy", {"features": n})
action = torch.tanh(h[:, :3] * 2.0)
annotate.output_tensors("policy", TensorSemantics(name="action", ref=action,
                                                  kind=OutputKindEnum.JOINT_POSITION),
                        export_with="jit")
leapp.stop()
leapp.compile_graph(visualize=False)
