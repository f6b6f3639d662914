"""Gateway overhead: the same calls made directly to an engine and through the gateway.

Starts a synthetic engine (bench/synthetic_engine.py, no model), the gateway in front of it, and
two peers: a bare grpc.aio pass-through proxy (raw bytes relayed with no metadata parsing, routing,
health or metrics: what a grpc.aio gateway costs before it does any work; the gateway was first
built on grpc.aio) and Envoy with one worker (bench/envoy_peer.py: the proxy the field trusts, in
front of llm-d and Envoy AI Gateway), each in its own process. Then it measures from this
process, for each target:
- concurrency 1: p50/p99 latency of unary Generate and of whole GenerateStream calls;
- concurrency C (default 64): unary calls/s and streamed messages/s, plus the CPU time the
  proxy process spent per call or message (from /proc), which gives the rate one fully used
  core could relay: on a small machine client, engine and proxy share the cores, so the
  wall-clock rate understates what a gateway host would do.
The client sends pre-serialized requests and reads raw bytes, so its own cost is small and the
same for every target. One run on a shared machine moves by up to 2x, so each figure is the median
of `--repeats` rounds (each round's figures are kept in the JSON). Within a round the targets take
turns: the calls at concurrency 1 one call each, the throughput runs `--slice` seconds each (the
machine's drift over seconds then falls on all of them alike), in an order rotated each round so
none always goes first or last.

    python bench/gateway_overhead.py                 # the figures in docs/performance.md (a few minutes)
    python bench/gateway_overhead.py --duration 1 --repeats 1    # quicker
    python bench/gateway_overhead.py --no-install    # Envoy only if already installed, else without it
    python bench/gateway_overhead.py --json FILE     # also write the figures as JSON (bench/report.py)
    python bench/gateway_overhead.py --baseline ../before   # also the gateway of another checkout
                                                     # (a git worktree of the commit before a change)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
from grpc import aio
from results import add_json_argument

from dpgate.v1 import generate_pb2
from gateway import compiled

ROOT = Path(__file__).resolve().parent.parent
GENERATE = "/dpgate.v1.InferenceService/Generate"
GENERATE_STREAM = "/dpgate.v1.InferenceService/GenerateStream"
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
ENVOY = "Envoy 1.40, one worker (peer)"
INTERPRETED = "dpgate gateway, data path as Python"
ROLES = {
    "direct": "direct",
    "bare grpc.aio proxy (peer)": "peer",
    ENVOY: "envoy",
    "dpgate gateway": "dpgate",
    INTERPRETED: "dpgate-interpreted",
}


@dataclass(slots=True)
class Result:
    scenario: str
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    per_second: float = 0.0
    cpu_us: float | None = None  # proxy CPU per call or message (None for the direct target)
    # What dpgate's own histogram (dpgate_gateway_added_latency_seconds) says it added over the
    # same calls (unary c=1 only; None for the other targets and for a gateway without it).
    own_added_p50_ms: float | None = None
    own_added_p99_ms: float | None = None


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND  # utime + stime


def start_process(args: list[str], marker: str, root: Path = ROOT) -> tuple[subprocess.Popen, str]:
    """Start a child (its imports from the checkout `root`) and wait for its `... listening on
    HOST:PORT` line; return it and the address."""
    process, line = start_process_line(args, marker, root)
    return process, line.split(marker, 1)[1].split()[0].rstrip(",")


def start_process_line(
    args: list[str], marker: str, root: Path = ROOT, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """`start_process`, returning the child's whole first line. The child runs in `root` as well as
    importing from it: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH,
    so a --baseline gateway started from this checkout's directory ran this checkout's code."""
    env = dict(os.environ, PYTHONPATH=str(root), **(extra_env or {}))
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=root)
    assert process.stdout is not None
    line = process.stdout.readline()
    if marker not in line:
        process.kill()
        raise RuntimeError(f"{args[1:4]} did not start: {line!r}")
    return process, line


def start_gateway(
    engine_address: str, root: Path = ROOT, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str, str | None]:
    """A dpgate gateway of the checkout `root` with its metrics on a port of its own choosing:
    the process, its address and its metrics address (None where the line does not say one)."""
    command = [sys.executable, "-m", "dpgate.cli", "gateway", "--port", "0", "--metrics-port", "0"]
    process, line = start_process_line([*command, "--engine", engine_address], "listening on ", root, extra_env)
    address = line.split("listening on ", 1)[1].split()[0].rstrip(",")
    metrics = line.split("metrics on ", 1)[1].split()[0].rstrip(",") if "metrics on " in line else None
    return process, address, metrics


async def wait_until_serving(channel: aio.Channel, request: bytes) -> None:
    call = channel.unary_unary(GENERATE)
    for _ in range(200):
        try:
            await call(request, timeout=1)
            return
        except aio.AioRpcError:
            await asyncio.sleep(0.05)
    raise RuntimeError("target never answered")


async def latency(channel: aio.Channel, request: bytes, num_calls: int, streaming: bool) -> list[float]:
    unary = channel.unary_unary(GENERATE)
    stream = channel.unary_stream(GENERATE_STREAM)
    samples = []
    for _ in range(num_calls):
        start = time.perf_counter()
        if streaming:
            async for _message in stream(request):
                pass
        else:
            await unary(request)
        samples.append(time.perf_counter() - start)
    return samples


async def throughput(
    channel: aio.Channel, request: bytes, concurrency: int, duration: float, streaming: bool
) -> tuple[int, float]:
    """(completed unary calls or relayed stream messages, seconds taken)."""
    unary = channel.unary_unary(GENERATE)
    stream = channel.unary_stream(GENERATE_STREAM)
    count = 0
    deadline = time.perf_counter() + duration

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            if streaming:
                async for _message in stream(request):
                    count += 1
            else:
                await unary(request)
                count += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return count, time.perf_counter() - start


def percentile(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


ADDED_LATENCY = "dpgate_gateway_added_latency_seconds"


def added_latency_buckets(metrics_address: str) -> dict[float, float]:
    """The gateway's added-latency histogram for unary Generate: upper bound -> cumulative count."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    text = urlopen(f"http://{metrics_address}/metrics", timeout=5).read().decode()
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == ADDED_LATENCY:
            for sample in family.samples:
                if sample.name.endswith("_bucket") and sample.labels.get("rpc") == "Generate":
                    buckets[float(sample.labels["le"])] = sample.value
    return buckets


def histogram_quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """The q-quantile of the observations made between two scrapes, interpolated within its bucket
    as Prometheus's histogram_quantile does (seconds; None when nothing was observed)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return lower  # past the last finite bucket: its bound, as Prometheus answers
            return lower + (bound - lower) * (rank - below) / (count - below) if count > below else bound
        lower, below = bound, count
    return None


@dataclass(slots=True)
class Target:
    """One thing the calls go to: its address, the process whose CPU is counted (None: the engine
    itself), and where a dpgate gateway's metrics are read (None: not a dpgate gateway)."""

    name: str
    address: str
    pid: int | None = None
    metrics_address: str | None = None


def channel_to(address: str) -> aio.Channel:
    return aio.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)])


async def interleaved_latency(
    channels: dict[str, aio.Channel], request: bytes, num_calls: int, streaming: bool, first: int
) -> dict[str, list[float]]:
    """`num_calls` sequential calls to each target, taken in turn one call at a time (the order
    rotated each turn, starting at target `first`): every target meets the same machine. A shared
    2-core machine drifts over seconds (other processes, the host's steal time), and when each
    target's calls ran as one block, a block that met a slow stretch moved a median by more than
    the gateways differ; call by call, the drift is the same for all of them."""
    unary = {name: channel.unary_unary(GENERATE) for name, channel in channels.items()}
    stream = {name: channel.unary_stream(GENERATE_STREAM) for name, channel in channels.items()}
    samples: dict[str, list[float]] = {name: [] for name in channels}
    names = list(channels)
    for turn in range(num_calls):
        shift = (first + turn) % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            if streaming:
                async for _message in stream[name](request):
                    pass
            else:
                await unary[name](request)
            samples[name].append(time.perf_counter() - start)
    return samples


async def sliced_throughput(
    targets: list[Target],
    channels: dict[str, aio.Channel],
    request: bytes,
    args: argparse.Namespace,
    streaming: bool,
    round_number: int,
) -> dict[str, tuple[int, float, float]]:
    """Each target's throughput run of `--duration` seconds, cut into slices of `--slice` seconds
    taken in turn (as the calls at concurrency 1 are, for the same reason: the machine's drift
    falls on every target alike); per target the calls or messages, the seconds and the proxy's
    CPU seconds, summed over its slices. A slice ends when its last call does, so every message
    counted was relayed inside the CPU time measured with it."""
    totals = {target.name: (0, 0.0, 0.0) for target in targets}
    num_slices = max(1, round(args.duration / args.slice))
    for turn in range(num_slices):
        shift = (round_number + turn) % len(targets)
        for target in targets[shift:] + targets[:shift]:
            cpu_before = process_cpu_seconds(target.pid) if target.pid else 0.0
            count, seconds = await throughput(
                channels[target.name], request, args.concurrency, args.duration / num_slices, streaming
            )
            cpu_seconds = process_cpu_seconds(target.pid) - cpu_before if target.pid else 0.0
            done, taken, cpu = totals[target.name]
            totals[target.name] = (done + count, taken + seconds, cpu + cpu_seconds)
    return totals


async def measure_round(targets: list[Target], args: argparse.Namespace, round_number: int) -> dict[str, list[Result]]:
    """One round: the calls at concurrency 1 interleaved across the targets, then the throughput
    runs, interleaved by slices; each target's results in the order unary c=1, unary c=C,
    stream c=1, stream c=C. (The order of the targets is rotated by the round, so none always
    runs first or last.)"""
    request = generate_pb2.GenerateRequest(text="hello").SerializeToString()
    channels = {target.name: channel_to(target.address) for target in targets}
    results: dict[str, list[Result]] = {target.name: [] for target in targets}
    try:
        for target in targets:
            await wait_until_serving(channels[target.name], request)
        for streaming in (False, True):
            name = "stream" if streaming else "unary"
            for target in targets:
                await latency(channels[target.name], request, 100, streaming)  # warm-up
            own = {  # dpgate's own added-latency histogram, read around the unary calls
                t.name: added_latency_buckets(t.metrics_address) for t in targets if t.metrics_address and not streaming
            }
            samples = await interleaved_latency(channels, request, args.calls, streaming, round_number)
            if own:
                await asyncio.sleep(0.05)  # the gateway accounts for a call just after its answer leaves
            for target in targets:
                taken = samples[target.name]
                result = Result(f"{name} c=1", percentile(taken, 50) * 1e3, percentile(taken, 99) * 1e3)
                if target.name in own and target.metrics_address is not None:
                    after = added_latency_buckets(target.metrics_address)
                    p50 = histogram_quantile(0.5, own[target.name], after)
                    p99 = histogram_quantile(0.99, own[target.name], after)
                    result.own_added_p50_ms = p50 * 1e3 if p50 is not None else None
                    result.own_added_p99_ms = p99 * 1e3 if p99 is not None else None
                results[target.name].append(result)
            totals = await sliced_throughput(targets, channels, request, args, streaming, round_number)
            for target in targets:
                count, seconds, cpu_seconds = totals[target.name]
                cpu_us = cpu_seconds / count * 1e6 if target.pid else None
                results[target.name].append(
                    Result(f"{name} c={args.concurrency}", per_second=count / seconds, cpu_us=cpu_us)
                )
    finally:
        for channel in channels.values():
            await channel.close()
    return results


def median_results(rounds: list[list[Result]]) -> list[Result]:
    """Each scenario's figures as the median over the rounds (the same scenarios in the same order)."""
    medians = []
    for same in zip(*rounds, strict=True):
        cpu = [r.cpu_us for r in same if r.cpu_us is not None]
        own_p50 = [r.own_added_p50_ms for r in same if r.own_added_p50_ms is not None]
        own_p99 = [r.own_added_p99_ms for r in same if r.own_added_p99_ms is not None]
        medians.append(
            Result(
                same[0].scenario,
                statistics.median(r.p50_ms for r in same),
                statistics.median(r.p99_ms for r in same),
                statistics.median(r.per_second for r in same),
                statistics.median(cpu) if cpu else None,
                statistics.median(own_p50) if own_p50 else None,
                statistics.median(own_p99) if own_p99 else None,
            )
        )
    return medians


def report(targets: dict[str, list[Result]], args: argparse.Namespace) -> None:
    from machine import describe_machine

    print(f"\nsynthetic engine, {args.tokens} tokens a call ({args.tokens + 2} messages a stream); "
          f"{args.calls} sequential calls for latency, {args.duration:g} s per throughput run "
          f"in turns of {args.slice:g} s; "
          f"median of {args.repeats} interleaved rounds; "
          f"{os.cpu_count()} CPUs shared by client, engine and proxy, on a busy machine")  # fmt: skip
    print(describe_machine(with_torch=False))
    print(f"dpgate gateway's data path: {compiled.status()}")
    direct = targets["direct"]
    for name, results in targets.items():
        print(f"\n{name}")
        for base, result in zip(direct, results, strict=True):
            if result.p50_ms:
                added = "" if name == "direct" else f"  added p50 {result.p50_ms - base.p50_ms:+.3f} ms"
                print(f"  {result.scenario:<14} p50 {result.p50_ms:7.3f} ms  p99 {result.p99_ms:7.3f} ms{added}")
                if result.own_added_p50_ms is not None and result.own_added_p99_ms is not None:
                    print(f"  {'':<14} its own histogram ({ADDED_LATENCY}): added p50 "
                          f"{result.own_added_p50_ms:.3f} ms, p99 {result.own_added_p99_ms:.3f} ms")  # fmt: skip
            else:
                unit = "messages/s" if result.scenario.startswith("stream") else "calls/s"
                line = f"  {result.scenario:<14} {result.per_second:9,.0f} {unit}"
                if result.cpu_us is not None:
                    line += f"  proxy CPU {result.cpu_us:6.1f} us each = {1e6 / result.cpu_us:8,.0f} {unit} per core"
                print(line)
    if ENVOY in targets:
        print_against(targets, ENVOY, "Envoy", args)
    if INTERPRETED in targets:
        print_against(targets, INTERPRETED, "Python", args)
    for name in targets:
        if ROLES.get(name) is None:  # a --baseline checkout's gateway
            print_against(targets, name, "before", args)


def print_against(targets: dict[str, list[Result]], peer_name: str, label: str, args: argparse.Namespace) -> None:
    """dpgate / the peer for the figures issue 27 sets targets on (a ratio under 1 is better for dpgate,
    except for the rates)."""
    direct, envoy, ours = ({r.scenario: r for r in targets[name]} for name in ("direct", peer_name, "dpgate gateway"))
    c = args.concurrency
    rows = []
    for kind in ("unary", "stream"):
        base = direct[f"{kind} c=1"].p50_ms
        rows.append((f"{kind} added p50 at c=1 (ms)", ours[f"{kind} c=1"].p50_ms - base,
                     envoy[f"{kind} c=1"].p50_ms - base))  # fmt: skip
        rows.append((f"{kind} p99 at c=1 (ms)", ours[f"{kind} c=1"].p99_ms, envoy[f"{kind} c=1"].p99_ms))
        unit = "calls/s" if kind == "unary" else "messages/s"
        rows.append((f"{kind} {unit} at c={c}", ours[f"{kind} c={c}"].per_second, envoy[f"{kind} c={c}"].per_second))
        rows.append((f"proxy CPU per {kind} {'call' if kind == 'unary' else 'message'} (us)",
                     ours[f"{kind} c={c}"].cpu_us or 0.0, envoy[f"{kind} c={c}"].cpu_us or 0.0))  # fmt: skip
    print(f"\ndpgate against {peer_name} (medians)")
    for figure, value, peer in rows:
        ratio = f"{value / peer:6.2f}x" if peer > 0 else "     -"
        print(f"  {figure:<34} dpgate {value:10.3f}  {label} {peer:10.3f}  {ratio}")


def write_json(
    targets: dict[str, list[Result]], rounds: dict[str, list[list[Result]]], args: argparse.Namespace
) -> None:
    """The figures for bench/report.py: each target's scenarios (medians) with its role (direct, peer,
    envoy, dpgate), and each round's scenarios under `rounds`."""
    from results import write_results

    results = {
        "tokens": args.tokens,
        "calls": args.calls,
        "duration_s": args.duration,
        "slice_s": args.slice,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "targets": [
            {
                "name": name,
                "role": ROLES.get(name, "baseline"),
                "scenarios": [asdict(r) for r in rs],
                "rounds": [[asdict(r) for r in round_] for round_ in rounds[name]],
            }
            for name, rs in targets.items()
        ],
    }
    write_results(args.json, "gateway_overhead", results, with_torch=False)


def serve_bare_proxy(engine: str) -> None:
    """The peer: a grpc.aio relay of raw bytes to one engine with nothing else (no routing, metadata, metrics)."""

    async def main() -> None:
        channel = aio.insecure_channel(engine)
        upstream = channel.unary_unary(GENERATE)
        upstream_stream = channel.unary_stream(GENERATE_STREAM)

        async def generate(request: bytes, context: aio.ServicerContext) -> bytes:
            return await upstream(request, timeout=context.time_remaining())

        async def generate_stream(request: bytes, context: aio.ServicerContext) -> None:
            async for message in upstream_stream(request, timeout=context.time_remaining()):
                await context.write(message)

        server = aio.server()
        server.add_registered_method_handlers(
            "dpgate.v1.InferenceService",
            {
                "Generate": grpc.unary_unary_rpc_method_handler(generate),
                "GenerateStream": grpc.unary_stream_rpc_method_handler(generate_stream),
            },
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(f"bare proxy listening on 127.0.0.1:{port}", flush=True)
        await server.wait_for_termination()

    import uvloop

    uvloop.run(main())


def start_envoy(engine_address: str, args: argparse.Namespace, started: list[subprocess.Popen]) -> str | None:
    """Envoy relaying to the engine (installed first where missing, unless --no-install); its address,
    or None with a line saying why it is left out."""
    import envoy_peer

    from dpgate.cache_dir import dpgate_cache_dir
    from dpgate.ports import free_port

    cache = dpgate_cache_dir()
    if args.no_envoy or (args.no_install and not envoy_peer.installed(cache)):
        print("Envoy left out of this run (--no-envoy, or --no-install and not installed)")
        return None
    envoy = envoy_peer.install(cache)
    port = free_port()
    config = cache / "envoy-gateway-overhead" / f"relay-{os.getpid()}.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        envoy_peer.command(envoy, config, port, engine_address), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    started.append(process)
    return f"127.0.0.1:{port}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="sequential calls for latency")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per throughput run")
    parser.add_argument("--slice", type=float, default=0.5,
                        help="the throughput runs are taken in turns of this many seconds per target")  # fmt: skip
    parser.add_argument("--tokens", type=int, default=64, help="tokens per call from the synthetic engine")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds; each figure is their median")
    parser.add_argument("--no-envoy", action="store_true", help="leave Envoy out")
    parser.add_argument("--no-install", action="store_true", help="use Envoy only if it is already installed")
    parser.add_argument("--baseline", metavar="CHECKOUT", type=Path,
                        help="also run the gateway of another checkout of dpgate as one more target in the same "
                        "rounds (a git worktree of the commit before a change)")  # fmt: skip
    parser.add_argument("--interpreted", action="store_true",
                        help="also run this checkout's gateway with its data path as Python "
                        f"({compiled.INTERPRETED_ENV}=1): what the mypyc build buys")  # fmt: skip
    parser.add_argument("--bare-proxy", metavar="ENGINE", help=argparse.SUPPRESS)  # internal: run the floor
    add_json_argument(parser)
    args = parser.parse_args()
    if args.bare_proxy:
        serve_bare_proxy(args.bare_proxy)
        return 0
    if args.repeats < 1 or args.calls < 2 or args.duration <= 0 or args.slice <= 0 or args.concurrency < 1:
        parser.error(
            "--repeats and --concurrency must be at least 1, --calls at least 2, --duration and --slice positive"
        )
    if args.baseline is not None and not (args.baseline / "gateway" / "gateway_command.py").is_file():
        parser.error(f"--baseline {args.baseline} is not a checkout of dpgate (it has no gateway/gateway_command.py)")
    python = sys.executable
    started: list[subprocess.Popen] = []
    try:
        engine, engine_address = start_process(
            [python, str(ROOT / "bench/synthetic_engine.py"), "--port", "0", "--num-tokens", str(args.tokens)],
            "listening on ",
        )
        started.append(engine)
        bare, bare_address = start_process([python, __file__, "--bare-proxy", engine_address], "listening on ")
        started.append(bare)
        targets = [Target("direct", engine_address), Target("bare grpc.aio proxy (peer)", bare_address, bare.pid)]
        envoy_address = start_envoy(engine_address, args, started)
        if envoy_address is not None:
            targets.append(Target(ENVOY, envoy_address, started[-1].pid))
        gateway, gateway_address, gateway_metrics = start_gateway(engine_address)
        started.append(gateway)
        targets.append(Target("dpgate gateway", gateway_address, gateway.pid, gateway_metrics))
        if args.baseline is not None:
            name = f"dpgate gateway at {checkout_commit(args.baseline)}"
            before, before_address, before_metrics = start_gateway(engine_address, args.baseline.resolve())
            started.append(before)
            targets.append(Target(name, before_address, before.pid, before_metrics))
        if args.interpreted:
            python_form, python_address, python_metrics = start_gateway(
                engine_address, extra_env={compiled.INTERPRETED_ENV: "1"}
            )
            started.append(python_form)
            targets.append(Target(INTERPRETED, python_address, python_form.pid, python_metrics))
        import uvloop

        names = [target.name for target in targets]
        rounds: dict[str, list[list[Result]]] = {name: [] for name in names}
        for round_number in range(args.repeats):
            measured = uvloop.run(measure_round(targets, args, round_number))
            for name in names:
                rounds[name].append(measured[name])
            print(f"round {round_number + 1}/{args.repeats} done", flush=True)
        medians = {name: median_results(rounds[name]) for name in names}
        report(medians, args)
        write_json(medians, rounds, args)
    finally:
        stop_processes(started)
    return 0


def checkout_commit(checkout: Path) -> str:
    """The short commit of a --baseline checkout (its directory's name where git cannot say)."""
    command = ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"]
    result = subprocess.run(command, capture_output=True, text=True)
    return result.stdout.strip() or checkout.name


def stop_processes(started: list[subprocess.Popen]) -> None:
    """End the processes a benchmark started, the last started first (SIGTERM, then SIGKILL after 10 s)."""
    for process in reversed(started):
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


if __name__ == "__main__":
    sys.exit(main())
