"""One node whose ports carry every element_names form upstream writes without Python
tags (flat, per-axis, None axes, TemporalAxis, and forms kept as given), kinds that are
enums, strings and numbers, extras holding enums and nested lists, and graph configs."""
import sys

import torch

import leapp
from leapp import GraphConfigs, InputKindEnum, OutputKindEnum, TemporalAxis, TensorSemantics
from leapp import annotate

FORMS = {
    "flat": ["a", "b"], "one": "a", "none": None, "empty": [],
    "multi": [["a", "b"], ["x", "y"]], "none_axis": [None, ["a", "b"]],
    "name_and_list": ["a", ["b", "c"]], "temporal": [TemporalAxis(20.0), ["a", "b"]],
    "numbers": [1, 2], "ragged": [["a"], 3], "scalar": 7, "mapping": {"a": 1},
}
KINDS = [InputKindEnum.JOINT_POSITION, "custom/kind", 5, None]

leapp.start("semantics_forms", save_path=sys.argv[1])
inputs = annotate.input_tensors("n", [
    TensorSemantics(name=name, ref=torch.ones(1, 2) * i, element_names=names,
                    kind=KINDS[i % len(KINDS)],
                    extra={"unit": "rad", "k": OutputKindEnum.KP, "l": [1, [2, 3]]}
                    if i % 3 == 0 else None)
    for i, (name, names) in enumerate(FORMS.items())])
total = sum(inputs[1:], inputs[0])
annotate.output_tensors("n", TensorSemantics(name="out", ref=total * 2, kind=OutputKindEnum.KD,
                                             element_names=["p", "q"]), export_with="jit")
leapp.stop()
leapp.compile_graph(visualize=False, graph_configs=GraphConfigs(frequency=50,
                                                                extra={"robot": "g1"}))
