"""bench/report_ratios.py's rows for bench/prefix_cache.py: each workload on against off, and with
--llamacpp the text multi-turn workload against llama.cpp's server."""

from __future__ import annotations

import report_ratios


def record(text_multi_turn: list[dict]) -> dict:
    case = {"case": "a", "name": "multi-turn chat",
            "on": {"ttft_p50_ms": 100.0, "output_tokens_per_s": 50.0},
            "off": {"ttft_p50_ms": 400.0, "output_tokens_per_s": 10.0}}  # fmt: skip
    return {"machine": "CPU: test", "results": {"cases": [case], "text_multi_turn": text_multi_turn}}


def test_each_workload_is_compared_with_the_cache_off():
    rows = report_ratios.prefix_cache_rows(record([]))
    assert [(row.figure, row.peer, row.ratio) for row in rows] == [
        ("TTFT p50, (a) multi-turn chat", "prefix cache off", 0.25),
        ("output throughput, (a) multi-turn chat", "prefix cache off", 5.0),
    ]


def test_the_text_workload_is_compared_with_llamacpps_server():
    text = [{"server": "dpgate serve (HTTP)", "ttft_p50_ms": 50.0, "output_tokens_per_s": 60.0},
            {"server": "llama.cpp server", "ttft_p50_ms": 500.0, "output_tokens_per_s": 20.0}]  # fmt: skip
    rows = report_ratios.prefix_cache_rows(record(text))[2:]
    assert [(row.peer, row.ratio, row.better) for row in rows] == [
        ("llama.cpp server", 0.1, "lower"),
        ("llama.cpp server", 3.0, "higher"),
    ]
