"""compile_graph's progress: a line per node, a bar on terminals, third-party notices
kept in log.txt.  One child process whose stderr is a real pseudo-terminal (so tqdm
draws its bar, and leapp's lines go) and whose stdout is a pipe compiles the same small graph three times:
by default, with verbose=False, and with TQDM_DISABLE=1."""
from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap
import threading

import pytest

from support import ROOT

SCRIPT = textwrap.dedent("""
    import logging, os, sys, warnings
    sys.path.insert(0, {root!r})
    import torch, leapp
    from leapp import annotate
    import leapp.compiling.backends.jit as jit_backend

    real_export = jit_backend.export

    def noisy_export(*args, **kwargs):  # a library's notices while the node exports
        warnings.warn("NOTICE-W raised by a library", FutureWarning)
        logging.getLogger("torch.onnx.notices").warning("NOTICE-L from torch's logger")
        return real_export(*args, **kwargs)

    jit_backend.export = noisy_export

    def run(graph, **kwargs):
        leapp.start(graph, save_path={save!r})
        x = annotate.input_tensors("a", {{"x": torch.ones(2)}})
        y = annotate.output_tensors("a", {{"y": x * 2}}, export_with="jit")
        z = annotate.input_tensors("b", {{"y": y}})
        annotate.output_tensors("b", {{"z": z + 1}}, export_with="jit")
        leapp.stop()
        for stream in (sys.stdout, sys.stderr):
            stream.write("<<" + graph + ">>\\n")
            stream.flush()
        result = leapp.compile_graph(visualize=False, **kwargs)
        assert result == {{"a": True, "b": True}}, result

    run("shown")
    run("quiet", verbose=False)
    os.environ["TQDM_DISABLE"] = "1"
    run("nobar")
    print("<<end>>", flush=True)
""")

LINE_A = "1/2 a (jit-script): exported in "
LINE_B = "2/2 b (jit-script): exported in "


def _sections(text: str) -> dict[str, str]:
    parts = {}
    for chunk in text.split("<<")[1:]:
        name, _, body = chunk.partition(">>")
        parts[name] = body
    return parts


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    """(stdout sections, terminal sections, bundle root) of the child's three compiles."""
    root = str(tmp_path_factory.mktemp("progress"))
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    env = {k: v for k, v in os.environ.items()
           if k not in ("TQDM_DISABLE", "PYTHONWARNINGS", "LEAPP_INCREMENTAL")}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(root=ROOT, save=root)],
                            stdout=subprocess.PIPE, stderr=slave, env=env, text=True)
    os.close(slave)
    received: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not data:
                return
            received.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        stdout, _ = proc.communicate(timeout=300)
    finally:
        reader.join(timeout=60)
        os.close(master)
    terminal = b"".join(received).decode("utf-8", "replace")
    assert proc.returncode == 0, terminal[-3000:]
    assert "<<end>>" in stdout, stdout[-3000:]
    return _sections(stdout), _sections(terminal), root


def test_a_line_per_node_on_stderr_nothing_on_stdout(child):
    """leapp's console is stderr (the bar's stream: the lines are written through it), as
    a library's; the script's stdout, here a pipe, gets nothing of leapp's."""
    out, terminal, _ = child
    for graph in ("shown", "nobar"):
        assert terminal[graph].count(LINE_A) == 1 and terminal[graph].count(LINE_B) == 1, \
            terminal[graph]
        assert terminal[graph].count("validation passed") == 2
        assert "artifacts saved" in terminal[graph]
        assert out[graph].strip() == "", out[graph]


def test_a_bar_on_a_terminal_until_tqdm_disable(child):
    _, terminal, _ = child
    assert "compile shown:" in terminal["shown"] and "100%" in terminal["shown"]
    assert "compile nobar" not in terminal["nobar"]


def test_verbose_false_silences_the_console_not_log_txt(child):
    out, terminal, root = child
    assert LINE_A not in out["quiet"] and "compile quiet" not in terminal["quiet"]
    log = open(os.path.join(root, "quiet", "log.txt")).read()
    assert f"[INFO]: {LINE_A}" in log


def test_third_party_notices_go_to_log_txt_only(child):
    out, terminal, root = child
    for graph in ("shown", "quiet", "nobar"):
        assert "NOTICE" not in out[graph] + terminal[graph]
    log = open(os.path.join(root, "shown", "log.txt")).read()
    assert "warning while exporting a:" in log and "FutureWarning: NOTICE-W" in log
    assert "torch.onnx.notices logged while exporting a: WARNING: NOTICE-L" in log
    assert f"[PROGRESS]: {LINE_A}" in log
