"""PyTorch SDPA on the GPU check's timing shapes: the anchor for the CUDA kernels' figures.

Run by bin/gpu-check on the GPU machine, right after GpuCheck, in the same call. Prints a markdown
table (and appends it to $OUT/gpu-check.txt when OUT is set). Same shapes, same FLOP count as
GpuCheck: 4*B*H*T*T*D, halved for causal; median of 10 timed launches after 3 warm-up launches,
timed by CUDA events.
"""
import os
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


def time_ms(fn, warmup=3, iters=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    device = torch.cuda.get_device_name(0)
    lines = ["", f"# PyTorch {torch.__version__} SDPA on {device}", "",
             "| backend | dtype | B | H | T | D | causal | ms (median of 10) | TFLOP/s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    b, h, d = 1, 16, 128
    for t in (4096, 8192, 16384):
        for causal in (False, True):
            for dtype in (torch.bfloat16, torch.float16):
                q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=dtype) for _ in range(3))
                flops = 4.0 * b * h * t * t * d * (0.5 if causal else 1.0)
                for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        with sdpa_kernel(backend):
                            ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                        lines.append(f"| {name} | {str(dtype).split('.')[-1]} | {b} | {h} | {t} | {d} | {causal} "
                                     f"| {ms:.3f} | {flops / ms / 1e9:.1f} |")
                    except RuntimeError as e:  # a backend that does not take this shape or device
                        lines.append(f"| {name} | {str(dtype).split('.')[-1]} | {b} | {h} | {t} | {d} | {causal} "
                                     f"| n/a | {str(e).splitlines()[0][:60]} |")
    print("\n".join(lines))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu-check.txt"), "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
