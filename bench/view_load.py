"""How long the interactive view of a 50-node bundle takes to open in headless Chromium.

    python bench/view_load.py [--repeats N]

Ours only (upstream has no view).  Builds a chain of 50 TorchScript nodes,
compiles it (which writes ``<graph>.html``), then opens the page in headless
Chromium (selenium, network disabled) until its 50 node groups are drawn.
Prints one JSON line (bench/_common.py's format): ``load_s``, the median time
from the request to the drawn graph, with a budget of 10 s.  Needs chromium,
chromedriver and selenium (``make setup``); tests/test_view.py checks the same
page's content and size without timing it.
"""
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit, median, parse_args  # noqa: E402

import leapp  # noqa: E402
from leapp import annotate  # noqa: E402

NODES = 50


def build(root: str) -> str:
    torch.manual_seed(0)
    leapp.start("fifty", save_path=root)
    x = annotate.input_tensors("n0", {"x": torch.randn(1, 8)})
    for i in range(NODES):
        if i:
            x = annotate.input_tensors(f"n{i}", {"x": x})
        x = annotate.output_tensors(f"n{i}", {"y": torch.tanh(x) * 0.5 + 0.1},
                                    export_with="jit")
    leapp.stop()
    assert all(leapp.compile_graph(verbose=False).values())
    return os.path.join(root, "fifty", "fifty.html")


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1500,1000", "--proxy-server=http://127.0.0.1:9",
                 "--proxy-bypass-list=<-loopback>", "--host-resolver-rules=MAP * ~NOTFOUND",
                 "--disable-background-networking", "--no-first-run"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options,
                            service=Service(executable_path=shutil.which("chromedriver")))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], repeats=5)
    repeats = 2 if args.quick else args.repeats
    from selenium.webdriver.common.by import By
    root = tempfile.mkdtemp(prefix="leapp-view-bench-")
    driver = None
    try:
        page = "file://" + os.path.abspath(build(root))
        driver = browser()
        driver.set_page_load_timeout(60)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            driver.get(page)
            drawn = len(driver.find_elements(By.CSS_SELECTOR, "g.node"))
            times.append(time.perf_counter() - started)
            assert drawn == NODES, f"{drawn} nodes drawn"
        size = os.path.getsize(page[len("file://"):])
    finally:
        if driver is not None:
            driver.quit()
        shutil.rmtree(root, ignore_errors=True)
    emit("VIEW", "the view of a 50-node bundle opened in headless Chromium",
         {"load_s": median(times), "page_bytes": size},
         budgets={"load_s": {"max": 10.0}}, info={"repeats": repeats})


if __name__ == "__main__":
    main()
