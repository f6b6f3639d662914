"""The batch-invariant kernels, one rule per op: row r of op(batch of M rows) is bitwise equal to
op(that row alone), for M = 1..64, in the served default (float32 activations, int8 weights) on
every instruction set this CPU runs. Test ids name the instruction set each case exercised.

Each kernel also gives the same bits as the scalar reference on every instruction set (so a row's
result does not depend on the CPU either), and is checked against a plain torch computation for
correctness.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engines import kernels
from engines.kernels.cpu import cpu_info
from engines.model.numerics import choose_numerics
from engines.model.quantization import quantize_rows_int8

ISAS = kernels.supported_isas()
FAST_ISAS = [isa for isa in ISAS if isa != "scalar"] or ["scalar"]
SERVED = choose_numerics("auto", "int8", True, cpu_info(), ISAS)
BATCH_SIZES = range(1, 65)


def rows_alone_vs_batched(op, sizes=BATCH_SIZES) -> list[int]:
    """Batch sizes M at which some row r of op(0, M) (the op on rows 0..M-1) differs from
    op(r, r + 1) (that row alone)."""
    alone = [op(r, r + 1) for r in range(max(sizes))]
    return [m for m in sizes if not all(torch.equal(op(0, m)[r : r + 1], alone[r]) for r in range(m))]


def test_the_served_default_is_float32_over_int8_on_the_fastest_kernel():
    assert (SERVED.dtype, SERVED.quantization, SERVED.batch_invariant) == ("float32", "int8", True)
    assert SERVED.isa == FAST_ISAS[-1], f"served {SERVED.isa}, this CPU runs {ISAS}"


# SmolLM2-135M's linear layers (qkv, o, gate_up, down, the tied lm_head) and an uneven width.
LINEAR_SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "odd": (100, 72)}


def int8_layer(out_features: int, in_features: int, seed: int = 0) -> kernels.PackedWeight:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator) * in_features**-0.5
    return kernels.pack_weight(*quantize_rows_int8(weight))


@pytest.mark.parametrize("layer", LINEAR_SHAPES)
@pytest.mark.parametrize("isa", FAST_ISAS)
def test_linear_rows_are_batch_invariant(isa, layer):
    out_features, in_features = LINEAR_SHAPES[layer]
    weight = int8_layer(out_features, in_features)
    x = torch.randn(64, in_features, generator=torch.Generator().manual_seed(1))
    assert rows_alone_vs_batched(lambda a, b: kernels.linear(x[a:b], weight, isa)) == []


@pytest.mark.parametrize("isa", FAST_ISAS)
def test_the_lm_head_rows_are_batch_invariant(isa):
    weight = int8_layer(49152, 576)
    x = torch.randn(64, 576, generator=torch.Generator().manual_seed(2))
    assert rows_alone_vs_batched(lambda a, b: kernels.linear(x[a:b], weight, isa), (1, 2, 3, 4, 5, 7, 16, 33, 64)) == []


@pytest.mark.parametrize("weight_dtype", [torch.int8, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("activation_dtype", [torch.float32, torch.bfloat16])
def test_linear_gives_the_reference_bits_on_every_instruction_set(weight_dtype, activation_dtype):
    """Every tile shape of every instruction set (rows 1..13 cover each remainder) equals the scalar
    reference, for each weight storage and activation dtype the kernel takes."""
    weight = torch.randn(200, 136, generator=torch.Generator().manual_seed(3))
    if weight_dtype == torch.int8:
        packed = kernels.pack_weight(*quantize_rows_int8(weight))
    else:
        packed = kernels.pack_weight(weight.to(weight_dtype))
    x = torch.randn(13, 136, generator=torch.Generator().manual_seed(4)).to(activation_dtype)
    for m in range(1, 14):
        reference = kernels.linear(x[:m], packed, "scalar")
        assert reference.dtype == activation_dtype
        for isa in ISAS:
            assert torch.equal(kernels.linear(x[:m], packed, isa), reference), (isa, m)


def test_linear_multiplies_by_the_int8_grid():
    weight = torch.randn(300, 576, generator=torch.Generator().manual_seed(5))
    quantized, scales = quantize_rows_int8(weight)
    x = torch.randn(9, 576, generator=torch.Generator().manual_seed(6))
    expected = (x.double() @ quantized.double().T) * scales.double()
    out = kernels.linear(x, kernels.pack_weight(quantized, scales), SERVED.isa)
    assert out.shape == (9, 300) and torch.allclose(out.double(), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("isa", FAST_ISAS)
def test_rms_norm_rows_are_batch_invariant(isa):
    x = torch.randn(64, 576, generator=torch.Generator().manual_seed(7)) * 3
    weight = torch.randn(576, generator=torch.Generator().manual_seed(8))
    assert rows_alone_vs_batched(lambda a, b: kernels.rms_norm(x[a:b], weight, 1e-5, isa)) == []
    out = kernels.rms_norm(x, weight, 1e-5, isa)
    assert torch.equal(out, kernels.rms_norm(x, weight, 1e-5, "scalar"))
    expected = weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("isa", FAST_ISAS)
def test_gated_activation_rows_are_batch_invariant(isa, activation):
    x = torch.randn(64, 2 * 1536, generator=torch.Generator().manual_seed(9)) * 4
    assert rows_alone_vs_batched(lambda a, b: kernels.act_and_mul(x[a:b], activation, isa)) == []
    out = kernels.act_and_mul(x, activation, isa)
    assert torch.equal(out, kernels.act_and_mul(x, activation, "scalar"))
    gate, up = x.double().split(1536, dim=-1)
    expected = (F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")) * up
    assert torch.allclose(out.double(), expected, rtol=1e-5, atol=1e-5)


class PagedCache:
    """A float32 KV cache with shuffled blocks; unwritten slots hold NaN, so reading one shows."""

    def __init__(self, num_kv_heads=3, head_dim=64, num_blocks=256, block_size=16, seed=10):
        self.block_size = block_size
        self.keys = torch.full((num_kv_heads, num_blocks * block_size, head_dim), float("nan"))
        self.values = torch.full_like(self.keys, float("nan"))
        self.free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
        self.generator = torch.Generator().manual_seed(seed + 1)

    def new_sequence(self, length: int) -> list[int]:
        return [self.free.pop() for _ in range(-(-length // self.block_size))]

    def write(self, table: list[int], positions: range, content: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Store keys and values [kv_heads, len(positions), dim] (random ones by default) at positions."""
        slots = torch.tensor([table[p // self.block_size] * self.block_size + p % self.block_size for p in positions])
        if content is None:
            shape = (self.keys.shape[0], len(positions), self.keys.shape[2])
            content = torch.randn(shape, generator=self.generator), torch.randn(shape, generator=self.generator)
        self.keys[:, slots], self.values[:, slots] = content

    def attend(self, q, tables, token_seq, positions, isa, window=None):
        width = max(len(t) for t in tables)
        block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        return kernels.attention(
            q, self.keys, self.values, block_tables, torch.tensor(token_seq, dtype=torch.int32),
            torch.tensor(positions, dtype=torch.long), self.block_size, 0.125, window, isa,
        )  # fmt: skip


@pytest.mark.parametrize("isa", FAST_ISAS)
def test_decode_attention_rows_are_batch_invariant(isa):
    """M sequences of different lengths decode together (every padded width from 1 to 64
    sequences): each query's output equals its output alone."""
    cache = PagedCache()
    lengths = torch.randint(1, 60, (64,), generator=torch.Generator().manual_seed(11)).tolist()
    tables = []
    for length in lengths:
        tables.append(cache.new_sequence(length))
        cache.write(tables[-1], range(length))
    q = torch.randn(64, 9, 64, generator=torch.Generator().manual_seed(12))
    positions = [length - 1 for length in lengths]

    def decode(first, stop):
        return cache.attend(q[first:stop], tables[first:stop], list(range(stop - first)), positions[first:stop], isa)

    assert rows_alone_vs_batched(decode) == []
    out = decode(0, 64)
    assert not out.isnan().any() and torch.equal(out, cache.attend(q, tables, list(range(64)), positions, "scalar"))


@pytest.mark.parametrize("window", [None, 50])
@pytest.mark.parametrize("isa", FAST_ISAS)
def test_a_prompt_attends_the_same_however_it_is_chunked(isa, window):
    """A 300-token prompt prefilled in chunks of 1, 7, 16, 64 or 300 tokens, each chunk in a step
    beside another sequence's decode, and written to the cache only as it is prefilled: every
    token's attention output is the same bits in every split (a chunk of 1 is a decode)."""
    generator = torch.Generator().manual_seed(13)
    q = torch.randn(300, 9, 64, generator=generator)
    prompt_kv = torch.randn(3, 300, 64, generator=generator), torch.randn(3, 300, 64, generator=generator)
    other_q = torch.randn(1, 9, 64, generator=generator)
    results = {}
    for chunk in (1, 7, 16, 64, 300):
        cache = PagedCache()
        prompt_table, other_table = cache.new_sequence(300), cache.new_sequence(400)
        cache.write(other_table, range(100))
        outputs = []
        for start in range(0, 300, chunk):
            stop = min(300, start + chunk)
            cache.write(prompt_table, range(start, stop), (prompt_kv[0][:, start:stop], prompt_kv[1][:, start:stop]))
            cache.write(other_table, range(100 + start // chunk, 101 + start // chunk))
            step_q = torch.cat([other_q, q[start:stop]])
            seq = [1] + [0] * (stop - start)
            pos = [100 + start // chunk, *range(start, stop)]
            outputs.append(cache.attend(step_q, [prompt_table, other_table], seq, pos, isa, window)[1:])
        results[chunk] = torch.cat(outputs)
        assert not results[chunk].isnan().any(), "a query read a slot that was never written"
    for chunk, out in results.items():
        assert torch.equal(out, results[300]), f"chunks of {chunk} differ from one chunk of 300"


def test_attention_matches_torch_sdpa():
    cache = PagedCache(seed=20)
    table = cache.new_sequence(300)
    cache.write(table, range(300))
    q = torch.randn(300, 9, 64, generator=torch.Generator().manual_seed(21))
    slots = torch.tensor([table[p // 16] * 16 + p % 16 for p in range(300)])
    positions = torch.arange(300)
    for window in (None, 50):
        visible = positions[None, :] <= positions[:, None]
        if window:
            visible &= positions[:, None] - positions[None, :] < window
        expected = F.scaled_dot_product_attention(
            q.transpose(0, 1), cache.keys[:, slots], cache.values[:, slots], attn_mask=visible, scale=0.125,
            enable_gqa=True,
        ).transpose(0, 1)  # fmt: skip
        out = cache.attend(q, [table], [0] * 300, list(range(300)), SERVED.isa, window)
        assert torch.allclose(out, expected, rtol=1e-5, atol=1e-5)


def random_attention_case(case: int, chunks: tuple[int, ...] = (1, 1, 9)) -> dict:
    """A random paged-attention call: head sizes whose column passes leave every kind of remainder
    (8 .. 256), 1..5 query heads per kv head, float32 or bfloat16 queries and caches, windows, and
    decode-context-parallel shards with their LSE; each sequence has a decode or a prompt chunk
    (its last `chunk` tokens, a chunk picked from `chunks`). Slots no query may read hold NaN."""
    generator = torch.Generator().manual_seed(100 + case)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=generator))]

    head_dim, kv_heads, group = pick([8, 24, 40, 64, 72, 136, 256]), pick([1, 2, 3]), pick([1, 2, 3, 4, 5])
    block_size, dcp_size = pick([8, 16, 32]), pick([1, 1, 2, 3])
    interleave = pick([i for i in (1, 2, 4, 8) if block_size % i == 0]) if dcp_size > 1 else 1
    dcp_rank = int(torch.randint(dcp_size, (1,), generator=generator))
    lengths = torch.randint(1, 200, (int(torch.randint(1, 4, (1,), generator=generator)),), generator=generator)
    logical = block_size * dcp_size
    num_blocks = sum(-(-int(n) // logical) for n in lengths) + 2
    free = torch.randperm(num_blocks, generator=generator).tolist()
    keys = torch.full((kv_heads, num_blocks * block_size, head_dim), float("nan"))
    values = torch.full_like(keys, float("nan"))
    tables, token_seq, positions = [], [], []
    for seq, length in enumerate(lengths.tolist()):
        table = [free.pop() for _ in range(-(-length // logical))]
        tables.append(table + [0] * (num_blocks - len(table)))
        for p in range(length):
            if (p // interleave) % dcp_size == dcp_rank:
                offset = p % logical
                slot = table[p // logical] * block_size + (offset // (interleave * dcp_size)) * interleave
                keys[:, slot + offset % interleave] = torch.randn(kv_heads, head_dim, generator=generator) * 2
                values[:, slot + offset % interleave] = torch.randn(kv_heads, head_dim, generator=generator)
        chunk = min(length, pick(list(chunks)))
        token_seq += [seq] * chunk
        positions += range(length - chunk, length)
    q = torch.randn(len(positions), kv_heads * group, head_dim, generator=generator) * 1.5
    return dict(
        q=q.to(pick([torch.float32, torch.bfloat16])), key_cache=keys.to(pick([torch.float32, torch.bfloat16])),
        block_tables=torch.tensor(tables, dtype=torch.int32), token_seq=torch.tensor(token_seq, dtype=torch.int32),
        positions=torch.tensor(positions), block_size=block_size, scale=head_dim**-0.5,
        window=pick([None, None, int(torch.randint(1, 60, (1,), generator=generator))]),
        dcp_size=dcp_size, dcp_rank=dcp_rank, interleave=interleave, values=values,
    )  # fmt: skip


@pytest.mark.parametrize("isa", FAST_ISAS)
def test_attention_gives_the_reference_bits_on_every_shape_and_instruction_set(isa):
    """Every instruction set cuts the work into its own register tiles and column passes (AVX-512
    reads a value row of 64 in one pass of sixteen lanes, AVX2 in three of eight): whatever the
    head size, group size, dtypes, window or shard, the outputs and LSEs are the scalar
    reference's bits, and finite."""
    for case in range(60):
        call = random_attention_case(case)
        call["value_cache"] = call.pop("values").to(call["key_cache"].dtype)

        def run(isa, call=call):
            return kernels.attention_shard(**call, isa=isa)

        (out, lse), (expected, expected_lse) = run(isa), run("scalar")
        assert not out.isnan().any(), f"case {case} read a slot it may not see"
        assert torch.equal(out, expected) and torch.equal(lse, expected_lse), f"case {case} differs from scalar"


@pytest.mark.parametrize("isa", FAST_ISAS)
def test_a_query_attends_the_same_in_a_tile_of_its_prompt_as_alone(isa):
    """Up to eight consecutive queries of a prompt chunk are computed together, each key and value
    read once for all of them, with the block of keys cut and resumed in the value sums: every
    query's output and LSE are still the bits of its own call alone (a decode), whatever the chunk
    length (tiles of 8 and a remainder), head size, group, dtypes, sliding window (a tile ends where
    the window starts to move) or decode-context-parallel shard (a query with no keys here)."""
    for case in range(40):
        call = random_attention_case(case, chunks=(2, 8, 9, 17, 40, 200))
        call["value_cache"] = call.pop("values").to(call["key_cache"].dtype)
        out, lse = kernels.attention_shard(**call, isa=isa)
        assert not out.isnan().any(), f"case {case} read a slot it may not see"
        for t in range(len(call["positions"])):
            alone = dict(call, q=call["q"][t : t + 1], token_seq=call["token_seq"][t : t + 1],
                         positions=call["positions"][t : t + 1])  # fmt: skip
            out_alone, lse_alone = kernels.attention_shard(**alone, isa=isa)
            assert torch.equal(out[t : t + 1], out_alone), f"case {case}: query {t} differs from its call alone"
            assert torch.equal(lse[t : t + 1], lse_alone), f"case {case}: query {t}'s LSE differs from alone"
