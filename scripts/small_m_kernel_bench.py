"""Time SmolLM2-135M's matrix products for M = 1..8 rows: torch's F.linear (MKL) against small_m_kernel.cpp.

The README's "Verifying n tokens on this CPU" quotes this. One thread; weights shaped like
SmolLM2-135M (30 layers of q, k, v, o, gate, up, down, and the 49,152-row LM head, fp32).

    g++ -O3 -march=native -shared -fPIC -o /tmp/small_m_kernel.so scripts/small_m_kernel.cpp
    OMP_NUM_THREADS=1 python scripts/small_m_kernel_bench.py /tmp/small_m_kernel.so
"""

import ctypes
import statistics
import sys
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
HIDDEN, INTERMEDIATE, KV, LAYERS, VOCAB = 576, 1536, 192, 30, 49152
kernel = ctypes.CDLL(sys.argv[1]).small_m_linear
kernel.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]


def ours(x, weight):
    out = torch.empty(x.shape[0], weight.shape[0])
    kernel(x.data_ptr(), x.shape[0], x.shape[1], weight.data_ptr(), weight.shape[0], out.data_ptr())
    return out


layer = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (INTERMEDIATE, HIDDEN),
         (INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]
weights = [torch.randn(shape) * 0.02 for _ in range(LAYERS) for shape in layer]
head = torch.randn(VOCAB, HIDDEN) * 0.02


def median_ms(run, repeats=7):
    run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


print("| rows | layers: torch | layers: ours | LM head: torch | LM head: ours | max abs difference |")
print("| --- | --- | --- | --- | --- | --- |")
for rows in range(1, 9):
    inputs = {width: torch.randn(rows, width) for width in (HIDDEN, INTERMEDIATE)}
    def stack(linear):
        for weight in weights:
            linear(inputs[weight.shape[1]], weight)
    difference = (ours(inputs[HIDDEN], head) - F.linear(inputs[HIDDEN], head)).abs().max().item()
    print(f"| {rows} | {median_ms(lambda: stack(F.linear)):.1f} ms | {median_ms(lambda: stack(ours)):.1f} ms | "
          f"{median_ms(lambda: F.linear(inputs[HIDDEN], head)):.1f} ms | {median_ms(lambda: ours(inputs[HIDDEN], head)):.1f} ms "
          f"| {difference:.1e} |")
