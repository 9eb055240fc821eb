"""State and feedback pipelines, runnable under this package or upstream leapp.

    python tests/state_scenarios.py OUTPUT_DIR [NAME ...]

Each scenario traces one small pipeline with leapp.start(NAME,
save_path=OUTPUT_DIR) and compiles it with validation, so the same script
gives two bundles to compare key by key (tests/test_feedback.py runs it under
the upstream reference in a subprocess).  The seed examples run too, as
feedback_example and stateful_gru (with the jit backend).
"""
import os
import sys

import torch
import torch.nn as nn

import leapp
from leapp import annotate


def _compile():
    leapp.stop()
    leapp.compile_graph(visualize=False, validate=True)


# ---- explicit state -----------------------------------------------------------

def counter(out):
    leapp.start("counter", save_path=out)
    obs = annotate.input_tensors("policy", {"obs": torch.ones(1, 3)})
    count = annotate.state_tensors("policy", {"counter": torch.zeros(1, 1)})
    count_next = count + 1.0
    action = obs * count_next
    annotate.update_state("policy", {"counter": count_next})
    annotate.output_tensors("policy", {"action": action}, export_with="jit")
    _compile()


def unupdated_state(out):
    leapp.start("unupdated_state", save_path=out)
    obs = annotate.input_tensors("policy", {"obs": torch.ones(1, 3)})
    bias = annotate.state_tensors("policy", {"bias": torch.full((1, 3), 0.5)})
    annotate.output_tensors("policy", {"action": obs + bias}, export_with="jit")
    _compile()


def history(out):
    leapp.start("history", save_path=out)
    obs = annotate.input_tensors("policy", {"obs": torch.tensor([[1.0, 2.0]])})
    hist = annotate.state_tensors("policy", {"history": torch.zeros(1, 8)})
    shifted = torch.cat([hist[:, 2:], obs], dim=-1)
    annotate.update_state("policy", {"history": shifted})
    annotate.output_tensors("policy", {"summary": shifted.mean(dim=-1, keepdim=True)},
                            export_with="jit")
    _compile()


def three_states(out):
    leapp.start("three_states", save_path=out)
    obs = annotate.input_tensors("policy", {"obs": torch.ones(1, 2)})
    a, b, c = annotate.state_tensors("policy", {
        "a": torch.zeros(1, 2), "b": torch.ones(1, 2), "c": torch.full((1, 1), 2.0)})
    a2 = a + obs
    b2 = b * 0.5 + a2
    c2 = c + 1.0
    annotate.update_state("policy", {"a": a2, "b": b2, "c": c2})
    annotate.output_tensors("policy", {"action": a2 + b2 * c2}, export_with="jit")
    _compile()


def state_loop(out):
    leapp.start("state_loop", save_path=out)
    last = torch.zeros(1, 2)
    for step in range(3):
        obs = annotate.input_tensors("policy", {"obs": torch.full((1, 2), float(step))})
        prev = annotate.state_tensors("policy", {"last_action": last})
        action = torch.tanh(obs + 0.5 * prev)
        last = annotate.update_state("policy", {"last_action": action})
        annotate.output_tensors("policy", {"action": action}, export_with="jit")
    _compile()


# ---- register_buffer -------------------------------------------------------------

def register_buffer(out):
    leapp.start("register_buffer", save_path=out)
    values = torch.zeros(3)
    x = annotate.input_tensors("scale", {"x": torch.tensor([1.0, 2.0, 3.0])})
    values = annotate.register_buffer("scale", {"values": values})
    values[:] = x
    annotate.output_tensors("scale", {"y": values * 100.0}, export_with="jit")
    _compile()


# ---- annotate.module -------------------------------------------------------------

class GRUCell(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(4, 6)
        self.head = nn.Linear(6, 2)
        self.register_buffer("h", torch.zeros(1, 1, 6))

    def forward(self, obs):
        y, h = self.gru(obs.unsqueeze(0), self.h)
        self.h = h
        return self.head(y.squeeze(0))


class LSTMCell(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 5)
        self.register_buffer("h", torch.zeros(1, 1, 5))
        self.register_buffer("c", torch.zeros(1, 1, 5))

    def forward(self, obs):
        y, (h, c) = self.lstm(obs.unsqueeze(0), (self.h, self.c))
        self.h, self.c = h, c
        return y.squeeze(0)


class PartialState(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(1, 3))
        self.register_buffer("step_count", torch.zeros(1, dtype=torch.int64))
        self.register_buffer("scale", torch.tensor([[2.0, 3.0, 4.0]]))

    def forward(self, obs):
        self.running_mean = 0.9 * self.running_mean + 0.1 * obs
        self.step_count = self.step_count + 1
        return (obs - self.running_mean) * self.scale


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(1, 3))
        self.register_buffer("gain", torch.full((1, 3), 0.5))

    def forward(self, x):
        self.acc = self.acc + x * self.gain
        return self.acc


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x):
        self.calls = self.calls + 1.0
        return self.inner(x) * self.calls


def _module_graph(out, name, model, obs, buffer_names=None, steps=1):
    torch.manual_seed(0)
    leapp.start(name, save_path=out)
    for _ in range(steps):
        traced = annotate.input_tensors("policy", {"obs": obs})
        annotate.module("policy", model, buffer_names=buffer_names)
        annotate.output_tensors("policy", {"action": model(traced)}, export_with="jit")
    _compile()


def gru_module(out):
    torch.manual_seed(0)
    _module_graph(out, "gru_module", GRUCell().eval(), torch.randn(1, 4))


def lstm_module(out):
    torch.manual_seed(0)
    _module_graph(out, "lstm_module", LSTMCell().eval(), torch.randn(1, 4), steps=3)


def partial_module(out):
    _module_graph(out, "partial_module", PartialState(), torch.tensor([[1.0, 2.0, 3.0]]))


def filtered_module(out):
    _module_graph(out, "filtered_module", PartialState(), torch.tensor([[1.0, 2.0, 3.0]]),
                  buffer_names=["running_mean"])


def nested_module(out):
    _module_graph(out, "nested_module", Outer(), torch.tensor([[1.0, 2.0, 3.0]]))


# ---- inferred feedback ----------------------------------------------------------

def two_node_loop(out):
    leapp.start("two_node_loop", save_path=out)
    memory = torch.zeros(1, 2)
    for step in range(2):
        obs, mem = annotate.input_tensors("a", {"obs": torch.full((1, 2), step + 1.0),
                                                "memory": memory})
        mixed = annotate.output_tensors("a", {"mixed": obs + 0.5 * mem}, export_with="jit")
        x = annotate.input_tensors("b", {"mixed": mixed})
        memory = annotate.output_tensors("b", {"memory_out": torch.tanh(x)}, export_with="jit")
    _compile()


def three_node_loop(out):
    leapp.start("three_node_loop", save_path=out)
    fb = torch.zeros(1, 2)
    for _ in range(2):
        obs, prev = annotate.input_tensors("n1", {"obs": torch.ones(1, 2), "prev": fb})
        o1 = annotate.output_tensors("n1", {"o1": obs - prev}, export_with="jit")
        x = annotate.input_tensors("n2", {"o1": o1})
        o2 = annotate.output_tensors("n2", {"o2": x * 2.0}, export_with="jit")
        y = annotate.input_tensors("n3", {"o2": o2})
        fb = annotate.output_tensors("n3", {"o3": torch.sin(y)}, export_with="jit")
    _compile()


def diamond_loop(out):
    leapp.start("diamond_loop", save_path=out)
    fb = torch.zeros(1, 3)
    for _ in range(2):
        obs, prev = annotate.input_tensors("src", {"obs": torch.ones(1, 3), "prev": fb})
        s = annotate.output_tensors("src", {"s": obs + prev}, export_with="jit")
        left = annotate.output_tensors(
            "left", {"l": annotate.input_tensors("left", {"s": s}) * 2.0}, export_with="jit")
        right = annotate.output_tensors(
            "right", {"r": annotate.input_tensors("right", {"s": s}) - 1.0}, export_with="jit")
        lj, rj = annotate.input_tensors("join", {"l": left, "r": right})
        fb = annotate.output_tensors("join", {"j": torch.tanh(lj + rj)}, export_with="jit")
    _compile()


def two_loops(out):
    leapp.start("two_loops", save_path=out)
    m1 = torch.zeros(1, 2)
    m2 = torch.zeros(1, 4)
    for _ in range(2):
        o, m = annotate.input_tensors("p1", {"obs": torch.ones(1, 2), "m": m1})
        y1 = annotate.output_tensors("p1", {"y1": o + m}, export_with="jit")
        m1 = annotate.output_tensors(
            "q1", {"m1": annotate.input_tensors("q1", {"y1": y1}) * 0.5}, export_with="jit")
        o, m = annotate.input_tensors("p2", {"obs": torch.ones(1, 4), "m": m2})
        y2 = annotate.output_tensors("p2", {"y2": o * m}, export_with="jit")
        m2 = annotate.output_tensors(
            "q2", {"m2": annotate.input_tensors("q2", {"y2": y2}) + 1.0}, export_with="jit")
    _compile()


def interleaved_forward(out):
    leapp.start("interleaved_forward", save_path=out)
    for _ in range(2):
        a_in = annotate.input_tensors("node_a", {"a_in": torch.ones(1, 2)})
        b_in = annotate.input_tensors("node_b", {"b_in": torch.full((1, 2), 3.0)})
        b_out = annotate.output_tensors("node_b", {"b_out": b_in * 2.0}, export_with="jit")
        from_b = annotate.input_tensors("node_a", {"from_b": b_out})
        annotate.output_tensors("node_a", {"a_out": a_in + from_b}, export_with="jit")
    _compile()


def self_loop(out):
    leapp.start("self_loop", save_path=out)
    memory = torch.zeros(2)
    for _ in range(3):
        x, m = annotate.input_tensors("a", {"x": torch.ones(2), "m": memory})
        memory = annotate.output_tensors("a", {"m_out": x + 0.5 * m}, export_with="jit")
    _compile()


def clone_loop(out):
    leapp.start("clone_loop", save_path=out)
    memory = torch.zeros(2)
    for _ in range(2):
        x, m = annotate.input_tensors("a", {"x": torch.ones(2), "m": memory})
        y = annotate.output_tensors("a", {"y": x + m}, export_with="jit")
        z = annotate.input_tensors("b", {"y": y.clone().detach()})
        memory = annotate.output_tensors("b", {"m_out": z * 0.5}, export_with="jit").clone()
    _compile()


def state_and_inferred(out):
    leapp.start("state_and_inferred", save_path=out)
    ext = torch.zeros(2)
    for _ in range(2):
        x, e = annotate.input_tensors("a", {"x": torch.ones(2), "ext": ext})
        h = annotate.state_tensors("a", {"h": torch.zeros(2)})
        h2 = h + x + e
        annotate.update_state("a", {"h": h2})
        y = annotate.output_tensors("a", {"y": h2 * 2.0}, export_with="jit")
        z = annotate.input_tensors("b", {"y": y})
        ext = annotate.output_tensors("b", {"ext_out": z - 1.0}, export_with="jit")
    _compile()


# ---- mirror_leapp_tags -------------------------------------------------------------

class _Holder:
    def __init__(self):
        self.buffer = torch.zeros(1, 4)


def mirror_copy(out):
    leapp.start("mirror_copy", save_path=out)
    holder = _Holder()
    x = annotate.input_tensors("producer", {"x": torch.arange(4.0).reshape(1, 4)})
    y = annotate.output_tensors("producer", {"y": x * 3.0}, export_with="jit")
    holder.buffer[:] = y
    annotate.mirror_leapp_tags(y, holder.buffer)
    z = annotate.input_tensors("consumer", {"z": holder.buffer})
    annotate.output_tensors("consumer", {"w": z - 1.0}, export_with="jit")
    _compile()


def overwrite_copy(out):
    """Full overwrites keep provenance without mirror_leapp_tags; partial ones do not."""
    leapp.start("overwrite_copy", save_path=out)
    full, copied, ellipsis, partial = (torch.zeros(2) for _ in range(4))
    cast = torch.zeros(2, dtype=torch.float64)
    x = annotate.input_tensors("a", {"x": torch.ones(2)})
    y = annotate.output_tensors("a", {"y": x * 3.0}, export_with="jit")
    full[:] = y
    copied.copy_(y)
    ellipsis[...] = y
    partial[:1] = y[:1]
    cast.copy_(y)
    for name, value in (("full", full), ("copied", copied), ("ellipsis", ellipsis),
                        ("partial", partial), ("cast", cast)):
        z = annotate.input_tensors(f"b_{name}", {"z": value})
        annotate.output_tensors(f"b_{name}", {"w": z + 1.0}, export_with="jit")
    _compile()


SCENARIOS = [counter, unupdated_state, history, three_states, state_loop, register_buffer,
             gru_module, lstm_module, partial_module, filtered_module, nested_module,
             two_node_loop, three_node_loop, diamond_loop, two_loops, interleaved_forward,
             self_loop, clone_loop, state_and_inferred,
             mirror_copy, overwrite_copy]


def main(out, names):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "examples"))
    saved = os.environ.get("LEAPP_EXAMPLE_BACKEND")
    os.environ["LEAPP_EXAMPLE_BACKEND"] = "jit"  # read when the examples are imported
    try:
        import feedback_example
        import stateful_gru_export
    finally:  # main() also runs inside the test process: leave its environment as it was
        if saved is None:
            os.environ.pop("LEAPP_EXAMPLE_BACKEND", None)
        else:
            os.environ["LEAPP_EXAMPLE_BACKEND"] = saved
    runners = {f.__name__: f for f in SCENARIOS}
    runners["feedback_example"] = feedback_example.main
    runners["stateful_gru"] = lambda o: stateful_gru_export.main(o, "jit")
    failed = []
    for name in names or list(runners):
        try:
            runners[name](out)
        except Exception as exc:  # keep going: the caller compares what was written
            failed.append(name)
            print(f"SCENARIO FAILED {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            try:
                leapp.stop()
            except Exception:
                pass
    return failed


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1], sys.argv[2:]) else 0)
