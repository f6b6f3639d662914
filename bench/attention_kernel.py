"""Microbench of dpgate's paged attention kernel on SmolLM2-135M's (or Gemma 3 270M's) shapes.

A decode step attends one query per sequence over that sequence's context, read through a block
table whose 16-slot blocks are scattered over the cache. This times one layer's call (cycling
through `--layers` layers' caches, 30 as in SmolLM2, so the caches are read from memory rather
than from a warm last-level cache, as in a real step) for
`--batch` sequences (1: batch-1 decode, 16: sixteen concurrent sequences) at contexts drawn from
256..384, float32 queries and cache, on every instruction set the library runs, and beside it
torch's scaled_dot_product_attention over the same context already gathered into dense
[batch, heads, context, dim] tensors (a padded batch with a mask): the same work minus the
paging, a reference that moves with the machine, so the ratio is comparable across runs.

Times are the calling thread's CPU time per call (`--threads 1`, the default, keeps the work on
that thread), the median of `--repeat` rounds of `--seconds` each: the machines this runs on are
shared, and wall time would mostly measure the other work. `--library` loads another build of
the kernel library (e.g. one built from main) so an A/B runs in two processes on one machine;
each run also checks its outputs against the scalar reference bit for bit.

`--chunk N` makes each sequence's step a prompt chunk instead of a decode: its last N tokens are
the queries (each sees the keys up to its own position), as when a new turn is prefilled after a
cached history (`--context 1400 1600`). The kernel computes up to eight consecutive queries of a
sequence together (one read of each key and value for all); sdpa gets the same causal rows.

    python bench/attention_kernel.py [--batch 1 16] [--model smollm2|gemma] [--isa avx2 avx512]
        [--layout scattered|contiguous] [--threads 1] [--chunk 1] [--context 256 384] [--library PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from engines import kernels

# (query heads, kv heads, head dim) of one attention layer.
MODELS = {"smollm2": (9, 3, 64), "gemma": (4, 1, 256)}
BLOCK_SIZE = 16
CONTEXT = (256, 384)


class DecodeStep:
    """`batch` sequences' caches for `layers` layers in blocks of 16 slots (in random order over the cache, or
    each sequence's in a row), and the queries of each sequence's last `chunk` tokens (1: a decode)."""

    def __init__(
        self, batch: int, heads: int, kv_heads: int, dim: int, layers: int, scattered: bool = True, seed: int = 0,
        chunk: int = 1, context: tuple[int, int] = CONTEXT,
    ):  # fmt: skip
        generator = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(context[0], context[1] + 1, (batch,), generator=generator).tolist()
        self.chunk = chunk
        blocks_per_seq = -(-context[1] // BLOCK_SIZE)
        num_blocks = batch * blocks_per_seq + 8
        order = torch.randperm(num_blocks, generator=generator) if scattered else torch.arange(num_blocks)
        self.block_tables = order[: batch * blocks_per_seq].reshape(batch, blocks_per_seq).to(torch.int32)
        slots = num_blocks * BLOCK_SIZE
        self.key_caches = [torch.randn(kv_heads, slots, dim, generator=generator) for _ in range(layers)]
        self.value_caches = [torch.randn(kv_heads, slots, dim, generator=generator) for _ in range(layers)]
        self.layer = 0
        self.q = torch.randn(batch * chunk, heads, dim, generator=generator)
        self.token_seq = torch.arange(batch, dtype=torch.int32).repeat_interleave(chunk)
        self.positions = torch.tensor([p for n in self.lengths for p in range(n - chunk, n)], dtype=torch.long)
        self.scale = dim**-0.5
        self._dense_inputs()

    def _dense_inputs(self) -> None:
        """The same context gathered into [batch, kv_heads, longest, dim], with a key mask."""
        longest = max(self.lengths)
        positions = torch.arange(longest)
        table = self.block_tables.long()
        slots = table[:, positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE  # [batch, longest]
        self.dense_keys = [cache[:, slots].transpose(0, 1).contiguous() for cache in self.key_caches]
        self.dense_values = [cache[:, slots].transpose(0, 1).contiguous() for cache in self.value_caches]
        query_positions = self.positions.view(len(self.lengths), 1, self.chunk, 1)
        self.mask = positions[None, None, None, :] <= query_positions  # [batch, 1, chunk, longest]

    def next_layer(self) -> int:
        self.layer = (self.layer + 1) % len(self.key_caches)
        return self.layer

    def paged(self, isa: str, layer: int = 0) -> torch.Tensor:
        return kernels.attention(
            self.q, self.key_caches[layer], self.value_caches[layer], self.block_tables, self.token_seq,
            self.positions, BLOCK_SIZE, self.scale, None, isa,
        )  # fmt: skip

    def sdpa(self, layer: int = 0) -> torch.Tensor:
        batch, heads, dim = len(self.lengths), self.q.shape[1], self.q.shape[2]
        q = self.q.view(batch, self.chunk, heads, dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q, self.dense_keys[layer], self.dense_values[layer], attn_mask=self.mask, scale=self.scale,
            enable_gqa=True,
        )  # fmt: skip
        return out.transpose(1, 2).reshape(batch * self.chunk, heads, dim)


def cpu_us_per_call(fn, seconds: float, repeat: int) -> float:
    """Median over `repeat` rounds of about `seconds` each of fn's thread CPU time per call."""
    start = time.thread_time_ns()
    fn()  # warm: first touch of scratch
    calls = max(1, int(seconds * 1e9 / max(1, time.thread_time_ns() - start)))
    rounds = []
    for _ in range(repeat):
        start = time.thread_time_ns()
        for _ in range(calls):
            fn()
        rounds.append((time.thread_time_ns() - start) / calls / 1e3)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", type=int, default=30, help="distinct caches the calls cycle through")
    parser.add_argument("--seconds", type=float, default=0.2, help="CPU time of one round of calls")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--isa", nargs="+", help="instruction sets to time (default: all this CPU runs)")
    parser.add_argument(
        "--layout", choices=["scattered", "contiguous"], default="scattered",
        help="blocks in random order over the cache (a long-running server's) or each sequence's in a row",
    )  # fmt: skip
    parser.add_argument("--chunk", type=int, default=1, help="queries per sequence: its last N tokens (1: decode)")
    parser.add_argument("--context", type=int, nargs=2, default=list(CONTEXT), metavar=("LO", "HI"),
                        help="each sequence's length is drawn from LO..HI")  # fmt: skip
    parser.add_argument("--library", help="a built libdpgate_kernels.so to load instead of this checkout's")
    args = parser.parse_args()
    if min(args.threads, args.layers, args.repeat, args.chunk, *args.batch) < 1 or args.seconds <= 0:
        parser.error("--threads, --layers, --seconds, --repeat, --chunk and --batch must be positive")
    if not args.chunk <= args.context[0] <= args.context[1]:
        parser.error("--context LO HI needs --chunk <= LO <= HI")
    torch.set_num_threads(args.threads)
    if args.library:
        torch.ops.load_library(args.library)
        kernels._loaded = True  # the library's operators are registered: skip the build
    isas = args.isa or kernels.supported_isas()
    if not set(isas) <= set(kernels.supported_isas()):
        parser.error(f"--isa must be among this CPU's {kernels.supported_isas()}")
    heads, kv_heads, dim = MODELS[args.model]
    print(
        f"{args.model}: {heads} heads, {kv_heads} kv heads, dim {dim}, contexts {args.context[0]}..{args.context[1]}, "
        f"{'decode' if args.chunk == 1 else f'prompt chunks of {args.chunk}'}, "
        f"{args.layout} blocks, {args.layers} layers, {args.threads} thread(s); us per call (thread CPU time), "
        "ratio = sdpa / kernel"
    )
    for batch in args.batch:
        step = DecodeStep(batch, heads, kv_heads, dim, args.layers, scattered=args.layout == "scattered",
                          chunk=args.chunk, context=tuple(args.context))  # fmt: skip
        print(time_step(step, batch, isas, args.seconds, args.repeat), flush=True)


def time_step(step: DecodeStep, batch: int, isas, seconds: float, repeat: int) -> str:
    """One table row: SDPA's and each instruction set's us per call, after checking their outputs."""
    reference = step.paged("scalar")
    if not torch.allclose(step.sdpa(), reference, rtol=1e-4, atol=1e-5):
        raise SystemExit("the kernel disagrees with torch's SDPA")
    sdpa_us = cpu_us_per_call(lambda: step.sdpa(step.next_layer()), seconds, repeat)
    row = [f"batch {batch:3d}", f"sdpa {sdpa_us:8.1f}"]
    for isa in isas:
        if not torch.equal(step.paged(isa), reference):
            raise SystemExit(f"{isa} does not give the scalar reference's bits")
        us = cpu_us_per_call(lambda isa=isa: step.paged(isa, step.next_layer()), seconds, repeat)
        row.append(f"{isa} {us:8.1f} ({sdpa_us / us:4.2f}x)")
    return "  ".join(row)


if __name__ == "__main__":
    main()
