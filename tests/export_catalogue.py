"""The model families users export, each traced as one node (tests/test_export_catalogue.py).

Small models (a few thousand weights), fixed seeds, three traced passes each;
``trace(family, backend, save_path)`` runs one session and returns its graph name.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

import leapp
from leapp import annotate

BACKENDS = ("jit", "jit-trace", "onnx", "onnx-torchscript", "pt2")


class CnnEncoder(nn.Module):
    """Depth image encoder: conv, batch norm, ReLU, max pool, global average pool."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                 nn.MaxPool2d(2), nn.Conv2d(4, 8, 3), nn.BatchNorm2d(8),
                                 nn.ReLU(), nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(),
                                 nn.Linear(8, 4))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.net(image)


class AdaptivePool(nn.Module):
    """AdaptiveAvgPool2d((2, 2)) on an 11 x 11 feature map (2 does not divide 11)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, stride=2)
        self.pool = nn.AdaptiveAvgPool2d((2, 2))
        self.head = nn.Linear(16, 3)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(torch.relu(self.conv(image))).flatten(1))


class Attention(nn.Module):
    """A transformer block: multi-head self-attention, residual, LayerNorm, MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.norm = nn.LayerNorm(16)
        self.mlp = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attn(tokens, tokens, tokens, need_weights=False)
        x = self.norm(tokens + attended)
        return x + self.mlp(x)


class NormActivations(nn.Module):
    """An MLP with LayerNorm, GELU (tanh and exact), SiLU, ELU and Mish."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 16),
                                 nn.SiLU(), nn.Linear(16, 16), nn.GELU(approximate="tanh"),
                                 nn.ELU(), nn.Mish(), nn.Linear(16, 4))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class Recurrent(nn.Module):
    """A GRU cell and an LSTM cell, their state fed back each step."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRUCell(6, 8)
        self.lstm = nn.LSTMCell(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor,
                g: torch.Tensor) -> tuple:
        g = self.gru(obs, g)
        h, c = self.lstm(g, (h, c))
        return self.head(h), h, c, g


class GaussianHead(nn.Module):
    """A policy's distribution head: Normal(mean, exp(log_std)), its mode, entropy and
    the log-probability of a given action."""

    def __init__(self) -> None:
        super().__init__()
        self.mean = nn.Linear(8, 3)
        self.log_std = nn.Parameter(torch.full((3,), -0.5))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple:
        mean = torch.tanh(self.mean(obs))
        dist = torch.distributions.Normal(mean, self.log_std.exp().expand_as(mean),
                                          validate_args=False)
        return dist.mean, dist.entropy().sum(-1), dist.log_prob(action).sum(-1)


def quat_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    w1, x1, y1, z1 = a.unbind(-1)
    w2, x2, y2, z2 = b.unbind(-1)
    return torch.stack([w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
                        w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                        w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
                        w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2], dim=-1)


def quaternion(q: torch.Tensor, r: torch.Tensor, v: torch.Tensor) -> tuple:
    """Quaternion maths: normalise, compose, rotate a vector, yaw angle."""
    q = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-9)
    composed = quat_mul(q, r)
    conj = q * torch.tensor([1.0, -1.0, -1.0, -1.0])
    pure = torch.cat([torch.zeros_like(v[..., :1]), v], dim=-1)
    rotated = quat_mul(quat_mul(q, pure), conj)[..., 1:]
    w, x, y, z = q.unbind(-1)
    yaw = torch.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
    return composed, rotated, yaw


def pose(transform: torch.Tensor, point: torch.Tensor) -> tuple:
    """Pose maths: a 4 x 4 homogeneous transform inverted, a point moved into its frame."""
    inverse = torch.linalg.inv(transform)
    local = (inverse[..., :3, :3] @ point.unsqueeze(-1)).squeeze(-1) + inverse[..., :3, 3]
    return inverse, local


def imu_spectrum(signal: torch.Tensor) -> torch.Tensor:
    """IMU pre-processing: the magnitude spectrum of a window of samples (rfft)."""
    spectrum = torch.fft.rfft(signal - signal.mean(-1, keepdim=True), dim=-1)
    return spectrum.abs() / signal.shape[-1]


def numpy_pre(obs: torch.Tensor) -> torch.Tensor:
    """NumPy pre-processing inside the node: clip, normalise, stack with a history."""
    array = obs.numpy()
    clipped = np.clip(array, -2.0, 2.0)
    normalised = (clipped - clipped.mean(axis=1, keepdims=True)) / (
        clipped.std(axis=1, keepdims=True) + 1e-6)
    stacked = np.concatenate([normalised, np.abs(normalised), np.tanh(clipped)], axis=1)
    return torch.from_numpy(stacked).float()


def _models() -> dict:
    torch.manual_seed(0)
    return {"cnn": CnnEncoder().eval(), "adaptive_pool": AdaptivePool().eval(),
            "attention": Attention().eval(), "norm_act": NormActivations().eval(),
            "recurrent": Recurrent().eval(), "gaussian": GaussianHead().eval()}


def _step(family: str, model: nn.Module | None, backend: str, pass_: int,
          state: dict) -> None:
    g = torch.Generator().manual_seed(100 + pass_)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    node = family
    if family == "cnn":
        x = annotate.input_tensors(node, {"image": rand(2, 1, 12, 12)})
        annotate.output_tensors(node, {"features": model(x)}, export_with=backend)
    elif family == "adaptive_pool":
        x = annotate.input_tensors(node, {"image": rand(2, 1, 24, 24)})
        annotate.output_tensors(node, {"features": model(x)}, export_with=backend)
    elif family == "attention":
        x = annotate.input_tensors(node, {"tokens": rand(2, 5, 16)})
        annotate.output_tensors(node, {"out": model(x)}, export_with=backend)
    elif family == "norm_act":
        x = annotate.input_tensors(node, {"obs": rand(2, 12)})
        annotate.output_tensors(node, {"actions": model(x)}, export_with=backend)
    elif family == "recurrent":
        obs = annotate.input_tensors(node, {"obs": rand(2, 6)})
        h, c, gs = annotate.state_tensors(node, {"h": state["h"], "c": state["c"],
                                                 "g": state["g"]})
        out, h, c, gs = model(obs, h, c, gs)
        annotate.update_state(node, {"h": h, "c": c, "g": gs})
        annotate.output_tensors(node, {"actions": out}, export_with=backend)
        state.update(h=h.detach().clone(), c=c.detach().clone(), g=gs.detach().clone())
    elif family == "gaussian":
        obs, act = annotate.input_tensors(node, {"obs": rand(2, 8), "action": rand(2, 3)})
        mean, entropy, logp = model(obs, act)
        annotate.output_tensors(node, {"mean": mean, "entropy": entropy, "log_prob": logp},
                                export_with=backend)
    elif family == "quaternion":
        q, r, v = annotate.input_tensors(node, {"q": rand(3, 4), "r": rand(3, 4),
                                                "v": rand(3, 3)})
        composed, rotated, yaw = quaternion(q, r, v)
        annotate.output_tensors(node, {"composed": composed, "rotated": rotated, "yaw": yaw},
                                export_with=backend)
    elif family == "pose":
        rotation = torch.linalg.matrix_exp(torch.tensor([[0.0, -1.0, 0.5], [1.0, 0.0, -0.2],
                                                         [-0.5, 0.2, 0.0]]) * (0.3 + pass_))
        transform = torch.eye(4).repeat(2, 1, 1)
        transform[:, :3, :3] = rotation
        transform[:, :3, 3] = rand(2, 3)
        t, p = annotate.input_tensors(node, {"transform": transform, "point": rand(2, 3)})
        inverse, local = pose(t, p)
        annotate.output_tensors(node, {"inverse": inverse, "local": local}, export_with=backend)
    elif family == "imu_fft":
        x = annotate.input_tensors(node, {"imu": rand(2, 6, 16)})
        annotate.output_tensors(node, {"spectrum": imu_spectrum(x)}, export_with=backend)
    elif family == "numpy_pre":
        x = annotate.input_tensors(node, {"obs": rand(2, 5)})
        annotate.output_tensors(node, {"features": numpy_pre(x)}, export_with=backend)
    else:
        raise KeyError(family)


FAMILIES = ("cnn", "adaptive_pool", "attention", "norm_act", "recurrent", "gaussian",
            "quaternion", "pose", "imu_fft", "numpy_pre")


def trace(family: str, backend: str, save_path: str, passes: int = 3) -> str:
    """Trace family as one node exported with backend (three passes); the graph name."""
    models = _models()
    model = models.get(family)
    state = {"h": torch.zeros(2, 8), "c": torch.zeros(2, 8), "g": torch.zeros(2, 8)}
    graph = f"cat_{family}"
    leapp.start(graph, save_path=save_path)
    try:
        with torch.no_grad():
            for pass_ in range(passes):
                _step(family, model, backend, pass_, state)
    finally:
        leapp.stop()
    return graph

