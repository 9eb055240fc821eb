"""At least 60 distinct torch operations traced, exported with TorchScript, and
reproduced exactly by the saved .pt files."""
from __future__ import annotations

import os

import pytest
import torch

import leapp
from leapp import annotate

from op_catalogue import GROUPS, op_count


def test_catalogue_is_large_enough():
    assert op_count() >= 60


def _trace_group(bundle, name, inputs, fn, export_with):
    leapp.start(name, save_path=bundle.root)
    names = [f"in{i}" for i in range(len(inputs))]
    traced = annotate.input_tensors("node", dict(zip(names, inputs)))
    traced = traced if isinstance(traced, tuple) else (traced,)
    outputs = fn(*traced)
    annotate.output_tensors("node", outputs, export_with=export_with)
    leapp.stop()
    return outputs


@pytest.mark.parametrize("export_with", ["jit", "jit-trace"])
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_group_exports_and_reproduces(bundle, group, export_with):
    inputs, fn = GROUPS[group]
    traced_outputs = _trace_group(bundle, group, inputs, fn, export_with)
    eager = fn(*inputs)
    for key, value in traced_outputs.items():  # the traced pass saw true values
        assert torch.equal(value, eager[key]), key
    results = leapp.compile_graph(visualize=False)
    assert results == {"node": True}
    model = torch.jit.load(os.path.join(bundle.dir(group), "node.pt"))
    got = model(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(eager)
    for (key, expected), actual in zip(eager.items(), got):
        assert actual.dtype == expected.dtype, key
        assert actual.shape == expected.shape, key
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6, msg=key)
