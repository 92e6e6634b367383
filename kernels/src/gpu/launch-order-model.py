#!/usr/bin/env python3
"""When the last block of a causal tensor-core forward ends, by launch order (docs/CUDA.md, "fewer
instructions per tile", change 9). A model, not a measurement: `slots` blocks run at once (an H200's
132 SMs x 2 blocks of the m32 kernel), a block's time is its key tiles (query block qb of 128 rows sees
2 (qb + 1) tiles of 64 keys), and a free slot takes the next block in linear index order.

    kernels/src/gpu/launch-order-model.py [--slots 264] [--heads 16] [--batch 1]
"""
import argparse
import heapq


def makespan(durations, slots):
    free = [0] * slots
    end = 0
    for d in durations:
        t = heapq.heappop(free) + d
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def positive(text):
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive count, got {text}")
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=positive, default=264)
    ap.add_argument("--heads", type=positive, default=16)
    ap.add_argument("--batch", type=positive, default=1)
    a = ap.parse_args()
    hb = a.heads * a.batch
    print("T       ideal  per-head longest first  grid longest first")
    for t in (4096, 8192, 16384):
        nq = t // 128
        tiles = lambda qb: 2 * (qb + 1)
        per_head = [tiles(nq - 1 - x) for _ in range(hb) for x in range(nq)]   # x fastest, reversed
        grid = [tiles(nq - 1 - i // hb) for i in range(nq * hb)]                 # query block first
        ideal = sum(per_head) / a.slots
        print(f"{t:<7} {ideal:6.1f}  {makespan(per_head, a.slots) / ideal:22.2f}x {makespan(grid, a.slots) / ideal:18.2f}x")


if __name__ == "__main__":
    main()
