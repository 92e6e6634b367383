"""PyTorch SDPA on the GPU check's timing shapes: the anchor for the CUDA kernels' figures.

Run by bin/gpu-check on the GPU machine after the Java sections, in the same call. Prints markdown
tables and appends them to the results file ($OUT/gpu-check.txt, else ./gpu-check.txt).

Forward: same shapes, same FLOP count as GpuCheck: 4*B*H*T*T*D, halved for causal; median of 10
timed launches after 3 warm-up launches, timed by CUDA events.

Decode (`--decode` alone runs only this part): the issue's shape, B 1, 32 query heads over 8 kv
heads (GQA, enable_gqa=True), D 128, bf16 KV of 262,144 tokens, Tq 1, 4 and 16; median of 20 after
5 warm-up launches; bandwidth = K and V bytes over the time. When GpuDecodeCheck left
decode-times.tsv beside the results file, the ratio of our synchronized and unified kernels to the fastest SDPA backend
is printed (>= 1.0x is the issue's target).
"""
import os
import statistics
import sys

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


def decode(lines):
    b, h, hkv, d, tk = 1, 32, 8, 128, 262144
    dtype = torch.bfloat16
    k, v = (torch.randn(b, hkv, tk, d, device="cuda", dtype=dtype) for _ in range(2))
    kv_bytes = 2 * k.numel() * k.element_size()
    lines += ["", f"# PyTorch {torch.__version__} SDPA decode, B {b}, H {h} / Hkv {hkv}, D {d}, bf16 KV, Tk {tk}", "",
              "| backend | Tq | ms (median of 20) | K+V GB/s |", "| --- | --- | --- | --- |"]
    best = {}
    backends = (("default", None), ("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION))
    for tq in (1, 4, 16):
        q = torch.randn(b, h, tq, d, device="cuda", dtype=dtype)
        # The last tq positions of the sequence, causal: every query sees (nearly) every key. A
        # bottom-right causal mask as a boolean tensor would cost bandwidth of its own, so tq > 1
        # runs unmasked (1..15 keys of difference, immaterial for timing).
        for name, backend in backends:
            fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
            try:
                if backend is None:
                    ms = time_ms(fn, warmup=5, iters=20)
                else:
                    with sdpa_kernel(backend):
                        ms = time_ms(fn, warmup=5, iters=20)
                lines.append(f"| {name} | {tq} | {ms:.3f} | {kv_bytes / ms / 1e6:.0f} |")
                best[tq] = min(best.get(tq, float("inf")), ms)
            except RuntimeError as e:  # a backend that does not take this shape or device
                lines.append(f"| {name} | {tq} | n/a | {str(e).splitlines()[0][:60]} |")
    ours = os.path.join(os.environ.get("OUT") or ".", "decode-times.tsv")  # where GpuDecodeCheck wrote it
    if os.path.exists(ours):
        lines += ["", "| ours vs fastest SDPA backend | Tq | split | our ms | SDPA ms | speed-up (>= 1.0 is the target) |",
                  "| --- | --- | --- | --- | --- | --- |"]
        with open(ours) as f:
            next(f)
            for row in f:
                what, tq, split, ms, _ = row.rstrip("\n").split("\t")
                if what == "copy" or int(tq) not in best:
                    continue
                lines.append(f"| {what} | {tq} | {split} | {float(ms):.3f} | {best[int(tq)]:.3f} "
                             f"| {best[int(tq)] / float(ms):.2f}x |")
    else:
        lines.append("(no decode-times.tsv from GpuDecodeCheck: ratios not computed)")


def main():
    if "--decode" in sys.argv:
        lines = []
        decode(lines)
        emit(lines)
        return
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
    decode(lines)
    emit(lines)


def emit(lines):
    print("\n".join(lines))
    # the results file of the Java sections: $OUT/gpu-check.txt, else ./gpu-check.txt
    with open(os.path.join(os.environ.get("OUT") or ".", "gpu-check.txt"), "a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
