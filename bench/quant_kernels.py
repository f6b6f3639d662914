"""A/B microbench of the quantized linear kernels on SmolLM2-135M's shapes, one process, one run.

One decode step (or prefill chunk) of SmolLM2-135M multiplies by 30 layers of qkv (960x576), o
(576x576), gate_up (3072x576) and down (576x1536), all Q4_1 in the packaged GGUF, plus the tied
lm_head (49152x576, Q8_0). This times those matmuls for M rows (1: batch-1 decode, 16: a decode
step of 16 sequences, 256: one prompt's prefill) on:

  gguf       dpgate's quant_linear over the GGUF grid as shipped (Q4_1 nibbles, Q8_0 bytes)
  gguf-gemv  the same kernel called once per row (what a GEMV-per-row prefill would cost)
  int-dot    dpgate's int_linear over the same GGUF codes, activations quantized to int8 per 32
             values, exact int32 sums (vpdpbusd with --isa avx512_vnni; the served default)
  int8       dpgate's linear over int8 re-quantized per output row (the served default until 2026-12-05)
  f32        dpgate's linear over the float32 dequantized weights
  torch-int4 torch.ops.aten._weight_int4pack_mm_for_cpu (what torchao's CPU int4 layout calls);
             bfloat16 scale+zero per group of 32, w = (q - 8) * scale + zero
  torch-int8 torch._weight_int8pack_mm (one scale per output row), float32 activations

It also says whether each torch op reproduces the GGUF grid: their scale formats hold d but
Q4_1's zero point m + 8 d is a rounded sum, and neither is batch invariant by contract.

    python bench/quant_kernels.py [--rows 1 16 256] [--isa avx2] [--threads 2] [--repeat 5] [--skip torch-int8]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from engines import kernels
from engines.kernels.gguf_blocks import decode
from engines.model.quantization import quantize_rows_int8

LAYERS = 30
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
LM_HEAD = (49152, 576)


def random_gguf(shape, qtype, seed):
    rng = np.random.default_rng(seed)
    raw = quantize((rng.standard_normal(shape) * shape[1] ** -0.5).astype(np.float32), qtype)
    return raw, dequantize(raw, qtype).reshape(shape).astype(np.float32)


def build(shape, qtype, seed):
    raw, dense = random_gguf(shape, qtype, seed)
    dense_t = torch.from_numpy(dense)
    layer = {
        "gguf": kernels.pack_quantized(decode(raw, qtype, shape)),
        "int-dot": kernels.pack_int_dot(decode(raw, qtype, shape)),
        "int8": kernels.pack_weight(*quantize_rows_int8(dense_t)),
        "f32": kernels.pack_weight(dense_t),
        "dense": dense_t,
    }
    int8, scales = quantize_rows_int8(dense_t)
    layer["torch-int8"] = (int8, scales)
    if qtype == GGMLQuantizationType.Q4_1:
        layer["torch-int4"] = torch_int4(decode(raw, qtype, shape))
    return layer


def torch_int4(weight):
    """The Q4_1 grid in torch's CPU int4 format: q unchanged, scale d, zero m + 8 d (bfloat16)."""
    codes = torch.from_numpy(weight.codes.astype(np.int32))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    scale = torch.from_numpy(weight.scales).T
    zero = torch.from_numpy(weight.offsets).T + 8 * scale
    return packed, torch.stack([scale, zero], dim=-1).to(torch.bfloat16).contiguous()


def run(path, layer, x, isa):
    if path in ("gguf", "int8", "f32", "int-dot"):
        return kernels.linear(x, layer[path], isa)
    if path == "gguf-gemv":
        return torch.cat([kernels.linear(x[i : i + 1], layer["gguf"], isa) for i in range(x.shape[0])])
    if path == "torch-int8":
        return torch._weight_int8pack_mm(x, *layer[path])
    packed, scale_zero = layer[path]
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), packed, 32, scale_zero).float()


def time_step(paths, layers, head, rows, isa, repeat):
    """Seconds of one model step's matmuls (30 layers + lm_head) per path, best of `repeat`."""
    x = {name: torch.randn(rows, shape[1]) for name, shape in SHAPES.items()}
    x_head = torch.randn(rows, LM_HEAD[1])
    result = {}
    for path in paths:
        head_path = "gguf" if path == "torch-int4" else path  # the lm_head is Q8_0: no int4 form
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            for name, layer in layers.items():
                for _ in range(LAYERS):
                    run(path, layer, x[name], isa)
            run(head_path, head, x_head, isa)
            best = min(best, time.perf_counter() - start)
        result[path] = best
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--isa", default=kernels.supported_isas()[-1])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--skip", nargs="*", default=[], help="paths not to time (torch-int8 takes minutes at 256 rows)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layers = {name: build(shape, GGMLQuantizationType.Q4_1, i) for i, (name, shape) in enumerate(SHAPES.items())}
    head = build(LM_HEAD, GGMLQuantizationType.Q8_0, 9)
    print(f"isa {args.isa}, {args.threads} threads; bytes per weight of one layer set:")
    weights = sum(s[0] * s[1] for s in SHAPES.values())
    gguf_bytes = sum(layer["gguf"].nbytes for layer in layers.values())
    int8_bytes = sum(layer["int8"].panels.numel() + layer["int8"].scales.numel() * 4 for layer in layers.values())
    print(f"  gguf {gguf_bytes / weights:.3f}, int8 {int8_bytes / weights:.3f}, f32 4.0")
    x = torch.randn(5, 576)
    gate_up = layers["gate_up"]
    exact = torch.equal(run("gguf", gate_up, x, args.isa), run("f32", gate_up, x, args.isa))
    reference = x.double() @ gate_up["dense"].double().T
    int4_error = (run("torch-int4", gate_up, x, args.isa).double() - reference).abs().max().item()
    gguf_error = (run("gguf", gate_up, x, args.isa).double() - reference).abs().max().item()
    int_dot_error = (run("int-dot", gate_up, x, args.isa).double() - reference).abs().max().item()
    print(f"  gguf == f32 kernel on the dequantized grid: {exact}; max |error| vs float64: gguf {gguf_error:.2e}, "
          f"int-dot {int_dot_error:.2e}, torch-int4 {int4_error:.2e}")  # fmt: skip
    paths = [p for p in ["gguf", "int-dot", "int8", "f32", "torch-int4", "torch-int8"] if p not in args.skip]
    print(f"{'rows':>5} " + " ".join(f"{p:>11}" for p in [*paths, "gguf-gemv"]) + "   (ms per step; tokens/s)")
    for rows in args.rows:
        gemv = ["gguf-gemv"] if rows > 1 and "gguf-gemv" not in args.skip else []
        times = time_step(paths + gemv, layers, head, rows, args.isa, args.repeat)
        cells = " ".join(f"{times[p] * 1e3:11.2f}" if p in times else f"{'':>11}" for p in [*paths, "gguf-gemv"])
        rates = ", ".join(f"{p} {rows / t:.0f}" for p, t in times.items())
        print(f"{rows:5d} {cells}   {rates}")


if __name__ == "__main__":
    main()
