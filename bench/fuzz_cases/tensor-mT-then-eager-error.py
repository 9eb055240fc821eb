"""leapp fuzz program s11_0030 (seed 11, index 30).

Features: backend:jit, backend:onnx-torchscript, extra_outputs, group:reductions, group:reshapes, method:varargs, nodes:2, out_payload:dict, passes:2, payload:semantics, run_no_grad, source:feedback, source:forward, source:fresh.
Run as-is under either leapp: python s11_0030.py OUT_DIR
"""
import os
import sys

import leapp
from leapp import InputKindEnum, OutputKindEnum, TensorSemantics, annotate

# ---- tests/op_catalogue.py, pasted ----------------------------------------
"""A catalogue of torch operations, grouped into nodes, shared by the export tests.

Each group is (inputs, fn): fn takes the inputs positionally (traced or plain)
and returns a dict of named outputs.  Together they cover arithmetic with
reversed scalars, reductions, reshapes and views, indexing and slicing with
setitem, casts, matmul, cat/stack, activations, normalisations, convolutions,
pooling and modules.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
X = torch.randn(2, 3, 4)
Y = torch.randn(2, 3, 4)
M = torch.randn(4, 5)
IMG = torch.randn(1, 3, 8, 8)
SEQ = torch.randn(1, 3, 16)
W_CONV = torch.randn(4, 3, 3, 3)
W_CONV1 = torch.randn(2, 3, 3)
W_T = torch.randn(3, 2, 3, 3)
LIN = nn.Linear(4, 6).eval()
MLP = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
CONV = nn.Conv2d(3, 2, 3, padding=1).eval()
NORM = nn.LayerNorm(4).eval()
BN = nn.BatchNorm2d(3).eval()
IDX = torch.tensor([2, 0, 1])


def arithmetic(x, y):
    return {
        "add": x + y, "sub": x - y, "mul": x * y, "div": x / (y.abs() + 1.0),
        "add_scalar": x + 1.5, "radd": 2.0 + x, "rsub": 3.0 - x, "rmul": 2.0 * x,
        "rdiv": 1.0 / (x.abs() + 1.0), "pow": x ** 2, "rpow": 2.0 ** x, "neg": -x,
        "abs": abs(x), "floordiv": x // 0.5, "mod": x % 0.7, "add_alpha": torch.add(x, y, alpha=2),
        "sqrt": torch.sqrt(x.abs()), "exp": torch.exp(x), "log": torch.log(x.abs() + 1),
        "sin": torch.sin(x), "cos": x.cos(), "clamp": x.clamp(min=-0.5, max=0.5),
        "maximum": torch.maximum(x, y), "where": torch.where(x > 0, x, y),
        "gt": (x > y).float(), "rsqrt": torch.rsqrt(x.abs() + 1),
    }


def reductions(x, y):
    return {
        "sum": x.sum(), "sum_dim": x.sum(dim=1), "mean_keep": x.mean(dim=-1, keepdim=True),
        "max_dim": x.max(dim=1).values, "max_all": x.max(), "min_dim": torch.min(x, dim=2)[0],
        "argmax": x.argmax(dim=-1), "prod": (x * 0.5).prod(dim=0), "std": x.std(dim=1),
        "var": x.var(), "norm": x.norm(dim=-1), "cumsum": torch.cumsum(x, dim=2),
        "logsumexp": torch.logsumexp(x, dim=1), "amax": torch.amax(y, dim=(0, 1)),
        "any": (x > 1).any(dim=-1), "all": (x > -3).all(),
    }


def reshapes(x, y):
    first, second = torch.chunk(x, 2, dim=-1)
    parts = x.split([1, 2], dim=1)
    return {
        "view": x.view(2, 12), "reshape": x.reshape(-1), "permute": x.permute(2, 0, 1),
        "transpose": x.transpose(0, 1), "flatten": torch.flatten(x, 1),
        "unsqueeze": x.unsqueeze(0), "squeeze": x[:1].squeeze(0), "expand": x[:, :1].expand(2, 3, 4),
        "repeat": y.repeat(1, 2, 1), "flip": torch.flip(x, dims=[2]), "roll": x.roll(1, dims=1),
        "chunk0": first, "chunk1": second, "split1": parts[1], "unbind": torch.unbind(y, 0)[1],
        "narrow": x.narrow(2, 1, 2), "contiguous": x.transpose(1, 2).contiguous(),
        "mT": x.mT, "T2d": x[0].T,
    }


def indexing(x, y):
    z = x.clone()
    z[:, 0] = 0.0
    z[0, 1:, 2] = y[0, 1:, 2]
    w = y.clone()
    w[w > 0] = 1.0
    u = torch.zeros(2, 3, 4)
    u[1] = x[0]
    return {
        "item0": x[0], "slice": x[:, 1:3], "step": x[..., ::2], "none": x[:, None],
        "neg_index": x[-1, -1], "index_select": torch.index_select(x, 2, IDX),
        "gather": torch.gather(x, 2, torch.zeros(2, 3, 1, dtype=torch.long)),
        "tensor_index": x[:, IDX], "setitem": z, "setitem_mask": w, "setitem_plain": u,
        "masked_fill": x.masked_fill(x < 0, -1.0),
    }


def casts(x, y):
    return {
        "to_double": x.to(torch.float64), "double": y.double(), "int": (x * 10).int(),
        "long": (x * 10).long(), "half_back": x.half().float(), "bool": x.bool(),
        "type_as": (x * 3).type_as(torch.zeros(1, dtype=torch.int32)),
        "to_kw": x.to(dtype=torch.float64), "float": (x > 0).float(),
    }


def matmul(x, y):
    return {
        "matmul_op": x @ M, "matmul": torch.matmul(x, M), "bmm": torch.bmm(x, y.transpose(1, 2)),
        "linear": F.linear(x, M.T, torch.ones(5)), "einsum": torch.einsum("bij,jk->bik", x, M),
        "cat": torch.cat([x, y], dim=-1), "stack": torch.stack([x, y], dim=0),
        "cat_list": torch.cat((x[0], y[0], x[1]), 0), "outer": torch.outer(x[0, 0], y[0, 0]),
        "module_linear": LIN(x), "mlp": MLP(x),
    }


def activations(x, y):
    return {
        "relu": torch.relu(x), "F_relu": F.relu(y), "gelu": F.gelu(x), "elu": F.elu(x),
        "leaky": F.leaky_relu(x, 0.1), "softmax": F.softmax(x, dim=-1),
        "log_softmax": torch.log_softmax(x, dim=1), "silu": F.silu(x), "softplus": F.softplus(x),
        "hardtanh": F.hardtanh(x), "relu6": F.relu6(x * 4), "sigmoid": torch.sigmoid(x),
        "tanh": x.tanh(), "mish": F.mish(y),
    }


def convolutions(img, seq):
    return {
        "conv2d": F.conv2d(img, W_CONV, padding=1), "conv1d": F.conv1d(seq, W_CONV1),
        "conv_t": F.conv_transpose2d(img, W_T, stride=2), "conv_module": CONV(img),
        "max_pool": F.max_pool2d(img, 2), "avg_pool": F.avg_pool2d(img, 2),
        "adaptive": F.adaptive_avg_pool2d(img, (2, 2)), "max_pool1d": F.max_pool1d(seq, 2),
        "layer_norm": F.layer_norm(seq, (16,)), "norm_module": NORM(seq[..., :4]),
        "batch_norm": BN(img), "group_norm": F.group_norm(img, 3),
        "normalize": F.normalize(seq, dim=-1), "interpolate": F.interpolate(img, scale_factor=2.0),
    }


GROUPS = {
    "arithmetic": ((X, Y), arithmetic),
    "reductions": ((X, Y), reductions),
    "reshapes": ((X, Y), reshapes),
    "indexing": ((X, Y), indexing),
    "casts": ((X, Y), casts),
    "matmul": ((X, Y), matmul),
    "activations": ((X, Y), activations),
    "convolutions": ((IMG, SEQ), convolutions),
}


def op_count() -> int:
    return sum(len(fn(*inputs)) for inputs, fn in GROUPS.values())
# ---- end of the catalogue ------------------------------------------------


@annotate.method(node_name='n1', export_with='onnx-torchscript')
def n1(*args):
    a, b = args
    r = reductions(a, b)
    main = r['cumsum']
    x0 = r['std']
    x1 = r['sum_dim']
    return main, x0, x1


def step(p, carry):
    outs = {}
    a, b = annotate.input_tensors('n0', [TensorSemantics(name='a', ref=carry.get('n0', torch.zeros(2, 3, 4)), kind=InputKindEnum.JOINT_POSITION), TensorSemantics(name='b', ref=torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(847 + p)))])
    r = reshapes(a, b)
    main = r['expand']
    x0 = r['mT']
    res = annotate.output_tensors('n0', {'main': main, 'x0': x0}, export_with='jit')
    outs['n0'] = res[0] if isinstance(res, tuple) else res
    res = n1(outs['n0'], outs['n0'])
    outs['n1'] = res[0] if isinstance(res, tuple) else res
    return outs


def main(out_dir):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    leapp.start('fz', save_path=out_dir)
    carry = {}
    try:
        with torch.no_grad():
            for p in range(2):
                carry = step(p, carry)
    except BaseException:
        try:
            leapp.stop()
        except Exception:
            pass
        raise
    leapp.stop()
    result = leapp.compile_graph(visualize=False)
    return os.path.join(out_dir, 'fz', 'fz.yaml'), result


if __name__ == "__main__":
    print(main(os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else 'fuzz_out')))
