"""Run exported bundles with this interpreter's leapp.InferenceManager.

    python bench/compat_im.py INPUTS.safetensors OUT.safetensors LABEL=YAML ...

INPUTS holds the graph inputs for every step, keyed ``"<step>|<node>/<input>"``.
For each bundle, a fresh InferenceManager(YAML) runs ``run_policy`` once per
step (feedback state carries over between steps, starting from the bundle's
initial values).  OUT receives ``"<label>|<step>|<node>/<output>"`` tensors.
The last stdout line is JSON: ``{"<label>": {"ok": bool, "error": str,
"outputs": [keys in the order run_policy returned them], "steps": n}}``.
Public API only, so it runs under either implementation.
"""

import json
import sys
import traceback

import torch
from safetensors.torch import load_file, save_file

from leapp import InferenceManager


def main(argv):
    if len(argv) < 3:
        raise SystemExit(__doc__)
    inputs = load_file(argv[0])
    steps = {}
    for key, value in inputs.items():
        step, name = key.split("|", 1)
        steps.setdefault(int(step), {})[name] = value
    out_path = argv[1]
    results, tensors = {}, {}
    for spec in argv[2:]:
        label, yaml_path = spec.split("=", 1)
        info = {"ok": False, "error": "", "outputs": [], "steps": 0}
        try:
            manager = InferenceManager(yaml_path)
            with torch.no_grad():
                for step in sorted(steps):
                    feed = {k: v.clone() for k, v in steps[step].items()}
                    outputs = manager.run_policy(feed)
                    if step == 0:
                        info["outputs"] = list(outputs)
                    for name, value in outputs.items():
                        t = value.detach().cpu().clone().contiguous()
                        tensors["%s|%d|%s" % (label, step, name)] = t
                    info["steps"] += 1
            info["ok"] = True
        except Exception:  # noqa: BLE001 - reported to the driver
            info["error"] = traceback.format_exc(limit=4)
        results[label] = info
    save_file(tensors, out_path)
    sys.stdout.flush()
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
