"""A fleet of robots: InferenceManager loop vs the in-process FleetRunner vs a served Triton fleet.

    python bench/fleet.py [--robots 1,8,32,128] [--seconds 10] [--long-seconds 60]

The pipeline is W7's 4-node locomotion pipeline (bench/w7_compile.py: onnx
normaliser, jit GRU cell with declared state, jit-trace actor, pt2 scaler
with static gains).  For each fleet size N, in one run, closed loops (a robot
sends its next observation when its action came back):

* ``im``: one Python process looping ``InferenceManager.run_policy`` over the
  robots, one manager (one state) per robot (at most 32 managers, reused
  round-robin above that: a step's cost does not depend on which robot it is);
* ``runner``: ``leapp.fleet.FleetRunner``, one onnxruntime call per step for
  all N robots (the batched fused model);
* ``served``: the repository ``leapp triton --serve-with python`` writes
  (batched by default, fleet size 128) in the nvidia-pytriton wheel's
  ``tritonserver``, N robots over one gRPC stream (each its own sequence).

Figures per point: robot-steps/s, p50 / p99 latency of a robot's step
(round trip for ``served``), the slowest robot's first answer after the start
of the point, server CPU per robot-step (server and python stubs, from
/proc), errors, and the ratios runner / im and served / im.  Robots 0 and
N-1 of the served fleet are spot-checked: their inputs are replayed through
their own ``InferenceManager`` and every action compared.  The largest fleet
runs ``--long-seconds``.  The server is stopped last and its exit status and
any /dev/shm region it left behind are reported.  One JSON line last.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import queue
import statistics
import sys
import tempfile
import threading
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

FLEET_SIZE = int(os.environ.get("LEAPP_BENCH_FLEET_SIZE", "128"))
IM_MANAGERS = 32


def _bundle(root: str) -> str:
    import w7_compile

    import leapp
    with contextlib.redirect_stdout(io.StringIO()):
        w7_compile.trace_pipeline(root)
        leapp.compile_graph(visualize=False)
    return os.path.join(root, "w7_pipeline", "w7_pipeline.yaml")


def _percentiles(samples: list[float]) -> tuple[float, float]:
    if not samples:
        return float("nan"), float("nan")
    ordered = sorted(samples)
    return (statistics.median(ordered) * 1e3, ordered[min(len(ordered) - 1,
                                                          int(0.99 * len(ordered)))] * 1e3)


def _im(yaml_path: str, robots: int, seconds: float) -> dict:
    from leapp import InferenceManager
    managers = [InferenceManager(yaml_path) for _ in range(min(robots, IM_MANAGERS))]
    obs = torch.randn(1, 48)
    steps, times = 0, []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for r in range(robots):
            t = time.perf_counter()
            managers[r % len(managers)].run_policy({"normaliser/obs": obs})
            times.append(time.perf_counter() - t)
        steps += robots
    elapsed = time.perf_counter() - start
    p50, p99 = _percentiles(times)
    return {"steps_per_s": steps / elapsed, "p50_ms": p50, "p99_ms": p99}


def _runner(batched: str, robots: int, seconds: float) -> dict:
    from leapp.fleet import FleetRunner
    fleet = FleetRunner(batched, robots)
    obs = torch.randn(robots, 48)
    steps, times = 0, []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        fleet.step({"normaliser/obs": obs})
        times.append(time.perf_counter() - t)
        steps += robots
    elapsed = time.perf_counter() - start
    p50, p99 = _percentiles(times)
    return {"steps_per_s": steps / elapsed, "p50_ms": p50, "p99_ms": p99}


def _server_cpu_s(pid: int) -> float:
    """User + system CPU seconds of the server and every process of its session."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == pid or int(entry) == pid:  # session id (field 6) is fields[3]
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _served(url: str, entry: str, robots: int, seconds: float, pid: int, first_id: int,
            spot: dict) -> dict:
    """N robots in closed loops over one gRPC stream; every robot ends its sequence."""
    import tritonclient.grpc as grpc
    client = grpc.InferenceServerClient(url)
    rng = np.random.default_rng(robots)
    lock = threading.Lock()
    sent_at: dict[int, float] = {}
    first: dict[int, float] = {}
    times: list[float] = []
    steps = {r: 0 for r in range(robots)}
    errors: list[str] = []
    done = queue.Queue()
    stopping = threading.Event()
    spot_robots = {0, robots - 1}
    log: dict[int, list] = {r: [] for r in spot_robots}

    def send(r: int, end: bool) -> None:
        obs = rng.standard_normal((1, 48)).astype(np.float32)
        if r in spot_robots:
            log[r].append([obs, None])
        tensor = grpc.InferInput("normaliser/obs", [1, 48], "FP32")
        tensor.set_data_from_numpy(obs)
        sent_at[r] = time.perf_counter()
        client.async_stream_infer(entry, [tensor], request_id=f"{r}:{int(end)}",
                                  sequence_id=first_id + r, sequence_start=steps[r] == 0,
                                  sequence_end=end)

    def callback(result, error) -> None:
        now = time.perf_counter()
        if error is not None:
            with lock:
                errors.append(str(error))
            done.put(None)
            return
        r, end = (int(x) for x in result.get_response().id.split(":"))
        with lock:
            times.append(now - sent_at[r])
            first.setdefault(r, now - started)
            steps[r] += 1
        if r in spot_robots:
            log[r][-1][1] = result.as_numpy("scaler/joint_targets").copy()
        if end:
            done.put(r)
            return
        send(r, stopping.is_set())

    client.start_stream(callback=callback, stream_timeout=seconds + 120)
    cpu0 = _server_cpu_s(pid)
    started = time.perf_counter()
    for r in range(robots):
        send(r, False)
    time.sleep(seconds)
    stopping.set()
    elapsed = time.perf_counter() - started
    cpu = _server_cpu_s(pid) - cpu0
    total = sum(steps.values())
    finished = 0
    deadline = time.monotonic() + 90
    while finished < robots and time.monotonic() < deadline:
        try:
            done.get(timeout=max(0.1, deadline - time.monotonic()))
            finished += 1
        except queue.Empty:
            break
    client.stop_stream()
    client.close()
    spot.update({first_id + r: log[r] for r in spot_robots})
    p50, p99 = _percentiles(times)
    return {"steps_per_s": total / elapsed, "p50_ms": p50, "p99_ms": p99,
            "first_answer_max_s": max(first.values()) if first else float("nan"),
            "robots_answered": len(first), "server_cpu_us_per_step": cpu / max(total, 1) * 1e6,
            "errors": len(errors) + (robots - finished), "first_error": errors[:1]}


def _spot_check(yaml_path: str, spot: dict) -> tuple[int, float]:
    from leapp import InferenceManager
    checked, worst = 0, 0.0
    for log in spot.values():
        manager = InferenceManager(yaml_path)
        for obs, got in log:
            if got is None:
                continue
            want = manager.run_policy({"normaliser/obs": torch.from_numpy(obs)})
            worst = max(worst, float(np.abs(want["scaler/joint_targets"].numpy() - got).max()))
            checked += 1
    return checked, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--robots", default="1,8,32,128")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--long-seconds", type=float, default=60.0)
    parser.add_argument("--skip-served", action="store_true")
    parser.add_argument("--server-log", help="keep tritonserver's output in this file")
    args = parser.parse_args()
    sizes = [int(n) for n in args.robots.split(",")]
    torch.set_num_threads(1)

    import leapp
    from leapp.triton import write_repository
    from leapp.triton_server import TritonServer

    rows = []
    with tempfile.TemporaryDirectory() as root:
        yaml_path = _bundle(root)
        with contextlib.redirect_stdout(io.StringIO()):
            batched = leapp.fuse(yaml_path, batch=True)
        for n in sizes:
            seconds = args.long_seconds if n == max(sizes) else args.seconds
            rows.append({"robots": n, "im": _im(yaml_path, n, min(seconds, args.seconds)),
                         "runner": _runner(batched, n, min(seconds, args.seconds))})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        shutdown = None
        if not args.skip_served:
            repository = write_repository(yaml_path, os.path.join(root, "repository"),
                                          serve_with="python", fleet_size=FLEET_SIZE)
            shm_before = set(os.listdir("/dev/shm"))
            server = TritonServer(repository.path, ready_timeout=300, log_path=args.server_log)
            server.start()
            spot: dict = {}
            try:
                first_id = 1
                for row in rows:
                    n = row["robots"]
                    seconds = args.long_seconds if n == max(sizes) else args.seconds
                    row["served"] = _served(server.grpc_url, repository.entry, n, seconds,
                                            server.pid, first_id, spot)
                    first_id += n
                    print(json.dumps(row["served"]), file=sys.stderr, flush=True)
            finally:
                process = server.process
                server.stop(timeout=30)
                leaked = sorted(set(os.listdir("/dev/shm")) - shm_before)
                shutdown = {"exit_status": process.returncode if process else None,
                            "shm_left": leaked}
            checked, worst = _spot_check(yaml_path, spot)
            shutdown.update({"spot_checked_steps": checked, "spot_worst_abs_diff": worst})
    for row in rows:
        base = row["im"]["steps_per_s"]
        row["runner_over_im"] = row["runner"]["steps_per_s"] / base
        if "served" in row:
            row["served_over_im"] = row["served"]["steps_per_s"] / base
    print(_table(rows, shutdown))
    print(json.dumps({"workload": "fleet", "load_average": os.getloadavg(),
                      "cpus": os.cpu_count(), "rows": rows, "shutdown": shutdown}))


def _table(rows: list, shutdown: dict | None) -> str:
    lines = ["| robots | IM loop steps/s | runner steps/s (x IM) | served steps/s (x IM) | "
             "served p50 / p99 ms | slowest first answer s | server CPU us/step | errors |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        served = row.get("served")
        cells = [str(row["robots"]), f"{row['im']['steps_per_s']:,.0f}",
                 f"{row['runner']['steps_per_s']:,.0f} ({row['runner_over_im']:.1f}x)"]
        if served:
            cells += [f"{served['steps_per_s']:,.0f} ({row['served_over_im']:.1f}x)",
                      f"{served['p50_ms']:.1f} / {served['p99_ms']:.1f}",
                      f"{served['first_answer_max_s']:.2f}",
                      f"{served['server_cpu_us_per_step']:.0f}", str(served["errors"])]
        else:
            cells += ["-"] * 5
        lines.append("| " + " | ".join(cells) + " |")
    if shutdown:
        lines.append(f"\nserver exit status {shutdown['exit_status']}, /dev/shm left: "
                     f"{shutdown['shm_left'] or 'none'}; spot-checked "
                     f"{shutdown['spot_checked_steps']} steps against InferenceManager, "
                     f"largest difference {shutdown['spot_worst_abs_diff']:.2g}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
