"""TensorSemantics (kind, element_names in every accepted form, extra) on
inputs and outputs, and static_outputs (plain dict and TensorSemantics)."""

import torch

import leapp
from leapp import InputKindEnum, OutputKindEnum, TensorSemantics, annotate
from _util import seeded, setup

name, out = setup(__file__)

JOINTS = ["hip", "knee", "ankle", "wrist"]

leapp.start(name, save_path=out)
with torch.no_grad():
    for i in range(2):
        pos, vel, cmd = annotate.input_tensors("observe", [
            TensorSemantics(name="joint_pos", ref=seeded(1, 4, seed=i),
                            kind=InputKindEnum.JOINT_POSITION, element_names=JOINTS),
            TensorSemantics(name="joint_vel", ref=seeded(1, 4, seed=10 + i),
                            kind=InputKindEnum.JOINT_VELOCITY,
                            element_names=[None, JOINTS], extra={"units": "rad/s"}),
            TensorSemantics(name="command", ref=seeded(1, 3, seed=20 + i),
                            kind="command/custom", element_names="vx"),
        ])
        obs = torch.cat([pos, vel * 0.1, cmd], dim=-1)
        obs = annotate.output_tensors("observe", {"obs": obs}, export_with="jit")

        x = annotate.input_tensors("act", {"obs": obs})
        target = x[..., :4] * 0.5
        gains = torch.sigmoid(x[..., 4:8])
        annotate.output_tensors(
            "act",
            [TensorSemantics(name="target", ref=target,
                             kind=OutputKindEnum.JOINT_POSITION, element_names=JOINTS,
                             extra={"clip": 1.5, "frame": "base"}),
             TensorSemantics(name="gains", ref=gains, kind=OutputKindEnum.KP)],
            static_outputs=[TensorSemantics(name="kd", ref=torch.full((1, 4), 0.3),
                                            kind=OutputKindEnum.KD,
                                            element_names=JOINTS)],
            export_with="jit")

        y = annotate.input_tensors("offset", {"obs": obs})
        annotate.output_tensors("offset", {"shifted": y + 1.0},
                                static_outputs={"bias": torch.tensor([4.0, 5.0, 6.0])},
                                export_with="jit")
leapp.stop()
leapp.compile_graph(visualize=False)
