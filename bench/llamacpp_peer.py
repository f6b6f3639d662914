"""llama.cpp's side of bench/engine_vs_llamacpp.py: the three figures through llama-cpp-python's
low-level API (llama_batch / llama_decode), measured the way llama.cpp's own tools define them.

- decode: llama-bench's tg — one sequence, one token per llama_decode from an empty context; the
  next token is the argmax of the step's logits (dpgate samples too, so both pay for it);
- prefill: llama-bench's pp — one llama_decode of the whole prompt, logits for its last token only;
- batched: llama-batched-bench's -npp P -ntg G -npl N — all N prompts in batches of n_batch tokens
  (prefill time), then G steps that decode one token of every sequence in one llama_batch (decode
  time); prefill rate N*P/t_pp, decode rate N*G/t_tg, end-to-end output N*G/(t_pp + t_tg).

The context is built once with n_seq_max = N and the KV cache is cleared between runs, so no run
reuses another's cache. The prompts are the caller's token ids, the same dpgate is fed.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

N_BATCH = 2048  # llama-bench's and llama-batched-bench's defaults
N_UBATCH = 512


class LlamaCppPeer:
    def __init__(self, llama_cpp, gguf_path: str, n_threads: int, n_ctx: int, n_seq_max: int, clock=time.perf_counter):
        self.lib = lib = llama_cpp
        self.clock = clock
        # llama.cpp logs every tensor it loads; the bench's output is its table.
        self._quiet = lib.llama_log_callback(lambda level, text, user_data: None)
        lib.llama_log_set(self._quiet, None)
        lib.llama_backend_init()
        model_params = lib.llama_model_default_params()
        self.model = lib.llama_model_load_from_file(gguf_path.encode(), model_params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, N_BATCH, N_UBATCH, n_seq_max
        params.n_threads = params.n_threads_batch = n_threads
        self.ctx = lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))
        self.batch = lib.llama_batch_init(N_BATCH, 0, n_seq_max)
        self.system_info = lib.llama_print_system_info().decode().strip()

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)

    def _clear(self) -> None:
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)

    def _fill(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """entries: (token, position, sequence, wants logits) per batch row."""
        batch = self.batch
        for i, (token, pos, seq, wants_logits) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = wants_logits
        batch.n_tokens = len(entries)

    def _decode(self) -> None:
        status = self.lib.llama_decode(self.ctx, self.batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")

    def _argmax(self, row: int) -> int:
        logits = self.lib.llama_get_logits_ith(self.ctx, row)
        return int(np.ctypeslib.as_array(ctypes.cast(logits, ctypes.POINTER(ctypes.c_float)), (self.n_vocab,)).argmax())

    def decode(self, first_token: int, num_tokens: int) -> float:
        """Batch-1 decode tok/s over `num_tokens` steps from an empty context."""
        self._clear()
        token = first_token
        started = self.clock()
        for pos in range(num_tokens):
            self._fill([(token, pos, 0, True)])
            self._decode()
            token = self._argmax(0)
        return num_tokens / (self.clock() - started)

    def prefill(self, prompt: list[int]) -> float:
        """Single-sequence prefill tok/s: the whole prompt in one llama_decode."""
        self._clear()
        started = self.clock()
        self._fill([(token, pos, 0, pos == len(prompt) - 1) for pos, token in enumerate(prompt)])
        self._decode()
        self._argmax(len(prompt) - 1)
        return len(prompt) / (self.clock() - started)

    def batched(self, prompts: list[list[int]], num_output: int) -> dict[str, float]:
        """len(prompts) sequences prefilled together, then `num_output` tokens each, decoded together."""
        self._clear()
        rows = [(token, pos, seq, pos == len(p) - 1) for seq, p in enumerate(prompts) for pos, token in enumerate(p)]
        started = self.clock()
        last_rows: dict[int, int] = {}
        for begin in range(0, len(rows), N_BATCH):
            part = rows[begin : begin + N_BATCH]
            self._fill(part)
            self._decode()
            last_rows.update({seq: i for i, (_, _, seq, wants) in enumerate(part) if wants})
        tokens = [self._argmax(last_rows[seq]) for seq in range(len(prompts))]
        prefilled = self.clock()
        for step in range(num_output - 1):
            self._fill([(tokens[seq], len(p) + step, seq, True) for seq, p in enumerate(prompts)])
            self._decode()
            tokens = [self._argmax(seq) for seq in range(len(prompts))]
        done = self.clock()
        t_pp, t_tg = prefilled - started, done - prefilled
        num_prompt = sum(len(p) for p in prompts)
        return {
            "prefill": num_prompt / t_pp,
            # The first output token of each sequence comes from the prefill, as in dpgate.
            "decode": len(prompts) * (num_output - 1) / t_tg,
            "end_to_end": len(prompts) * num_output / (t_pp + t_tg),
        }
