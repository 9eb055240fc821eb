"""Start and stop the ``tritonserver`` binary that the ``nvidia-pytriton`` wheel ships.

The wheel carries Triton Inference Server (its python backend only, no
onnxruntime or pytorch backend) and runs on CPU.  ``TritonServer`` lays the
server out the way it expects (the python backend's stub for this Python
version beside ``libtriton_python.so``), starts it on free loopback ports with
this interpreter's environment visible to the stub, waits until it is ready
and stops it by its process id::

    with TritonServer(repo_dir) as server:
        client = tritonclient.http.InferenceServerClient(server.http_url)

The python backend's stub embeds the interpreter found first on ``PATH``, so
the directory of ``sys.executable`` goes first on ``PATH`` and the directory
of this interpreter's ``libpython`` first on ``LD_LIBRARY_PATH``: the models
then import the packages of this environment (torch, onnxruntime) and, through
``PYTHONPATH``, the very leapp this process imported.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from typing import Any

logger = logging.getLogger("leapp")


class TritonUnavailable(RuntimeError):
    """No ``tritonserver`` here: the nvidia-pytriton wheel, its binary or its python
    backend stub for this Python version is missing.  Nothing was started."""


class TritonServerError(RuntimeError):
    """``tritonserver`` started and exited before it was ready: a model of the repository
    failed to load (``models`` names each, with the server's reason) or the server refused
    its repository or options.

    Attributes:
        returncode: the server's exit status.
        models: ``{model name: the reason the server gave}`` for every model that failed to
            load (empty when the server failed for another reason).
        log: the last lines of the server's output.
    """

    def __init__(self, message: str, returncode: int | None, models: dict[str, str],
                 log: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.models = models
        self.log = log


# tritonserver logs one line per model that did not load:
#   E1127 18:50:01.123 12 model_lifecycle.cc:654] failed to load 'name' version 1: Internal: ...
_FAILED_MODEL = re.compile(r"failed to load '([^']+)' version \d+: (.*)")


def failed_models(log: str) -> dict[str, str]:
    """``{model: reason}`` for every "failed to load" line of a ``tritonserver`` log."""
    failed: dict[str, str] = {}
    for line in log.splitlines():
        match = _FAILED_MODEL.search(line)
        if match:  # the reason's first line (the server escapes the traceback's newlines)
            reason = match.group(2).split("\\n")[0].strip().rstrip('".').strip()
            failed.setdefault(match.group(1), reason)
    return failed


def find_tritonserver() -> tuple[str, str]:
    """``(tritonserver distribution directory, its bundled libraries)`` from nvidia-pytriton."""
    try:
        import importlib.util
        spec = importlib.util.find_spec("pytriton")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise TritonUnavailable("tritonserver comes from the nvidia-pytriton wheel: "
                                "pip install --no-deps nvidia-pytriton==0.7.0")
    package = list(spec.submodule_search_locations)[0]
    dist = os.path.join(package, "tritonserver")
    libs = os.path.join(os.path.dirname(package), "nvidia_pytriton.libs")
    if not os.path.exists(os.path.join(dist, "bin", "tritonserver")):
        raise TritonUnavailable(f"{dist} holds no bin/tritonserver")
    return dist, libs


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on loopback now (the OS picks them)."""
    sockets = []
    try:
        for _ in range(count):  # all held open at once, so the OS cannot hand one out twice
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class TritonServer:
    """A ``tritonserver`` process serving one model repository on loopback.

    Args:
        repository: the model repository (``leapp.serving.triton.write_repository``).
        ready_timeout: seconds to wait for every model to load.
        log_path: where the server's output goes (default: a file in its work
            directory, kept until ``stop()``).
    """

    def __init__(self, repository: str, ready_timeout: float = 120.0,
                 log_path: str | None = None) -> None:
        self.repository = os.path.abspath(repository)
        self.ready_timeout = ready_timeout
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._workdir: str | None = None
        self.http_port = self.grpc_port = 0

    @property
    def pid(self) -> int:
        """The server's process id."""
        if self.process is None:
            raise RuntimeError("the server is not running")
        return self.process.pid

    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP endpoint (what ``tritonclient.http`` takes)."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the GRPC endpoint."""
        return f"127.0.0.1:{self.grpc_port}"

    def _layout(self) -> str:
        dist, libs = find_tritonserver()
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        stub = os.path.join(dist, "python_backend_stubs", version, "triton_python_backend_stub")
        if not os.path.exists(stub):
            raise TritonUnavailable(f"nvidia-pytriton has no python backend stub for "
                                    f"Python {version}")
        self._workdir = tempfile.mkdtemp(prefix="leapp-tritonserver-")
        root = os.path.join(self._workdir, "tritonserver")
        shutil.copytree(dist, root, ignore=shutil.ignore_patterns("python_backend_stubs"))
        shutil.copy(stub, os.path.join(root, "backends", "python"))
        self._libs = libs
        return root

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir, self._libs, env.get("LD_LIBRARY_PATH", "")) if p)
        env["PATH"] = os.pathsep.join(
            (os.path.dirname(os.path.abspath(sys.executable)), env.get("PATH", "")))
        # the stub imports the same leapp as this process, wherever that one lives: the
        # directory above the package this module is part of (leapp/serving/ -> leapp/ -> it)
        package_parent = os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
        return env

    def start(self) -> TritonServer:
        """Start the server and wait until it and every model are ready.

        Raises:
            TritonUnavailable: no ``tritonserver`` here (nothing was started).
            TritonServerError: the server exited before it was ready (a model failed to
                load: the error names it and the server's reason).
            TimeoutError: not ready within ``ready_timeout`` seconds.
        """
        root = self._layout()
        try:
            self.http_port, self.grpc_port = free_ports(2)
            if self.log_path is None:
                self.log_path = os.path.join(self._workdir or "", "tritonserver.log")
            command = [
                os.path.join(root, "bin", "tritonserver"),
                f"--model-repository={self.repository}",
                f"--backend-directory={os.path.join(root, 'backends')}",
                f"--cache-directory={os.path.join(root, 'caches')}",
                "--http-address=127.0.0.1", f"--http-port={self.http_port}",
                "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}",
                "--allow-metrics=false", "--allow-gpu-metrics=false",
                "--exit-timeout-secs=5",
                # the generated configs are complete: no model-level stub to ask the models
                "--disable-auto-complete-config",
            ]
            with open(self.log_path, "wb") as log:
                self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                env=self._environment(),
                                                start_new_session=True)
            logger.info("Started tritonserver (pid %d) on http %s, grpc %s for %s",
                        self.process.pid, self.http_url, self.grpc_url, self.repository)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        url = f"http://{self.http_url}/v2/health/ready"
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise self._exited()
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"tritonserver was not ready within {self.ready_timeout} s: "
                                   f"{self.log_tail()}")
            time.sleep(0.2)

    def _exited(self) -> TritonServerError:
        """The error for a server that exited before it was ready, naming failed models."""
        assert self.process is not None
        status = self.process.returncode
        try:
            with open(self.log_path or "", errors="replace") as handle:
                log = handle.read()
        except OSError:
            log = ""
        models = failed_models(log)
        tail = self.log_tail()
        if models:
            reasons = "; ".join(f"model '{name}' failed to load: {reason}"
                                for name, reason in models.items())
            message = (f"tritonserver exited with status {status} before it was ready: "
                       f"{reasons}. Fix the model (its files under "
                       f"{self.repository}/<model>/) and start the server again. "
                       f"Server log:\n{tail}")
        else:
            message = (f"tritonserver exited with status {status} before it was ready "
                       f"(repository {self.repository}). Server log:\n{tail}")
        return TritonServerError(message, status, models, tail)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's output."""
        try:
            with open(self.log_path or "", errors="replace") as handle:
                return "".join(handle.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by its process id (SIGTERM, then SIGKILL after ``timeout``)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            # SIGTERM to the server alone: it unloads the models and stops their stubs
            # itself (the stubs' shared memory is released then)
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                # its own session: the group holds the server and its stubs
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


__all__ = ["TritonServer", "TritonServerError", "TritonUnavailable", "failed_models",
           "find_tritonserver", "free_ports"]
