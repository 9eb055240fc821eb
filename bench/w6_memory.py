"""W6: 10,000 re-entry passes of the W1 pipeline in one session: memory growth.

One leapp.start() session; pass 0 traces the three nodes, passes 1..N-1
re-enter them (N = --passes, 10,000 by default).  Two windows:

* RSS window, tracemalloc off: from pass --mark (1,000) to pass N - K, where
  K = --tracemalloc-passes (1,000):
    rss_growth_bytes, rss_growth_per_pass_bytes        resident set size
    blocks_growth, blocks_growth_per_pass              sys.getallocatedblocks()
                                                       (live pymalloc blocks)
* tracemalloc window: the last K passes.  tracemalloc starts at pass N - K;
  the baseline is taken after K/10 further passes (so allocations caused by
  starting tracemalloc and first-use caches are not counted) and growth runs
  to the end, so only what is allocated per pass and still alive counts:
    tracemalloc_growth_bytes, tracemalloc_growth_per_pass_bytes

tracemalloc slows every allocation down severalfold, which is why it covers
the last K passes rather than the whole run; --tracemalloc-passes 0 traces
the whole window from --mark to N instead (slow, the RSS window is then the
same window, measured with tracemalloc on).

"Flat" (no leak) means fewer than 64 bytes per pass on the Python heap
(tracemalloc) and fewer than 256 bytes per pass of RSS (which also sees the
allocator's and torch's caching noise, hence the looser bound).

Also reported: reentry_pass_s, the median pass time over passes 1..mark.
"""

import gc
import os
import sys
import tracemalloc

import leapp
from _common import (W1Pipeline, emit, median, now, parse_args, quiet_stdout,
                     tempdir)

FLAT_TRACEMALLOC = 64   # bytes per pass
FLAT_RSS = 256          # bytes per pass


def rss_bytes():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: peak RSS is the best portable stand-in
        import resource
        scale = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def main():
    args = parse_args(__doc__, repeats=1, passes=(10000, "passes in the session"),
                      mark=(1000, "pass from which growth is measured"),
                      tracemalloc_passes=(1000, "passes traced by tracemalloc "
                                          "at the end (0: all after --mark)"))
    passes, mark, k = args.passes, args.mark, args.tracemalloc_passes
    if args.quick:
        passes, mark, k = 3000, 500, 500
    if k <= 0:
        k = passes - mark
    if not 0 < mark <= passes - k < passes - 1:
        raise SystemExit("need 0 < --mark <= --passes - --tracemalloc-passes")
    tm_from = passes - k
    tm_base = tm_from + max(k // 10, 1)
    pipe = W1Pipeline(export_with="jit")
    obs = [pipe.make_obs(i) for i in range(16)]

    times = []
    with quiet_stdout(), tempdir() as d:
        leapp.start("w6_memory", save_path=d)
        t_start = now()
        for i in range(passes):
            if i == mark:
                gc.collect()
                rss0, blocks0 = rss_bytes(), sys.getallocatedblocks()
            if i == tm_from:
                gc.collect()
                rss1, blocks1 = rss_bytes(), sys.getallocatedblocks()
                tracemalloc.start()
            if i == tm_base:
                gc.collect()
                heap0 = tracemalloc.get_traced_memory()[0]
            t0 = now()
            pipe.step(obs[i % len(obs)])
            if i < mark:
                times.append(now() - t0)
        gc.collect()
        heap1 = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        if tm_from == mark:  # one window, measured with tracemalloc on
            rss1, blocks1 = rss_bytes(), sys.getallocatedblocks()
        total_s = now() - t_start
        leapp.stop()

    rss_window = max((tm_from if tm_from > mark else passes) - mark, 1)
    heap_growth = heap1 - heap0
    rss_growth = rss1 - rss0
    blocks_growth = blocks1 - blocks0
    emit(
        "W6", "%d re-entry passes of W1 in one session: memory growth" % passes,
        figures={
            "tracemalloc_growth_per_pass_bytes": heap_growth / (passes - tm_base),
            "rss_growth_per_pass_bytes": rss_growth / rss_window,
            "blocks_growth_per_pass": blocks_growth / rss_window,
            "tracemalloc_growth_bytes": heap_growth,
            "rss_growth_bytes": rss_growth,
            "reentry_pass_s": median(times[1:]),
        },
        budgets={
            "tracemalloc_growth_per_pass_bytes": {"max": FLAT_TRACEMALLOC},
            "rss_growth_per_pass_bytes": {"max": FLAT_RSS},
        },
        info={"passes": passes, "mark": mark, "tracemalloc_from": tm_from,
              "rss_window_passes": rss_window, "tracemalloc_passes": k,
              "tracemalloc_baseline_pass": tm_base,
              "rss_at_mark_bytes": rss0, "total_s": total_s},
    )


if __name__ == "__main__":
    sys.exit(main())
