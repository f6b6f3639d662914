"""Which HTTP/1.1 server library the gateway's OpenAI API runs on: measured, not guessed.

Each candidate serves one trivial JSON POST (parse the body, answer a small JSON object) on a
uvloop loop, in its own process; this process drives it with a raw keep-alive HTTP/1.1 client
(pre-built request bytes, responses read by Content-Length, so the client costs the same for
every server) and reports:
- p50/p99 latency of one request at a time;
- requests/s at concurrency C over C connections, and the server process's CPU time per request
  (from /proc): on a small shared machine the wall-clock rate understates a server, the CPU per
  request does not.

Candidates: aiohttp's `web.Application` (what the gateway would use), aiohttp's low-level
`web.Server`, uvicorn (httptools parser) with Starlette, and uvicorn with a bare ASGI callable
(the floor under Starlette). The libraries need not be in dpgate's venv: give their folder with
`--libs` (e.g. a `pip install --target` folder); a candidate whose library is missing is skipped.

    python bench/http_server_choice.py --libs ~/.cache/dpgate/http-server-bench
    python bench/http_server_choice.py --requests 4000 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
CANDIDATES = ("aiohttp", "aiohttp-lowlevel", "uvicorn-starlette", "uvicorn-asgi")
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}'

SERVER = r"""
import asyncio, json, socket, sys
import uvloop

kind = sys.argv[1]
answer = {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "text": "hi"}]}

async def main():
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)  # before the print: a server started as a task may not have listened yet
    port = sock.getsockname()[1]
    if kind == "aiohttp":
        from aiohttp import web
        async def handle(request):
            body = await request.json()
            return web.json_response({**answer, "model": body["model"]})
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
    elif kind == "aiohttp-lowlevel":
        from aiohttp import web
        async def handle(request):
            body = json.loads(await request.read())
            return web.Response(body=json.dumps({**answer, "model": body["model"]}).encode(),
                                content_type="application/json")
        server = web.Server(handle, access_log=None)
        await asyncio.get_running_loop().create_server(server, sock=sock)
    else:
        import uvicorn
        if kind == "uvicorn-starlette":
            from starlette.applications import Starlette
            from starlette.requests import Request
            from starlette.responses import JSONResponse
            from starlette.routing import Route
            async def handle(request: Request):
                body = await request.json()
                return JSONResponse({**answer, "model": body["model"]})
            app = Starlette(routes=[Route("/v1/chat/completions", handle, methods=["POST"])])
        else:
            async def app(scope, receive, send):
                chunks = []
                while True:
                    message = await receive()
                    chunks.append(message.get("body", b""))
                    if not message.get("more_body"):
                        break
                body = json.loads(b"".join(chunks))
                data = json.dumps({**answer, "model": body["model"]}).encode()
                await send({"type": "http.response.start", "status": 200, "headers": [
                    (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
                await send({"type": "http.response.body", "body": data})
        config = uvicorn.Config(app, loop="none", http="httptools", lifespan="off", access_log=False,
                                log_level="warning")
        server = uvicorn.Server(config)
        server.install_signal_handlers = lambda: None
        asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    print(f"listening on 127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()

uvloop.run(main())
"""


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND


class Connection:
    """One keep-alive HTTP/1.1 connection sending the same POST again and again."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> None:
        self.reader, self.writer, self.request = reader, writer, request

    async def call(self) -> None:
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"unexpected answer: {head[:60]!r}")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await self.reader.readexactly(length)


async def connect(port: int, path: str = "/v1/chat/completions", body: bytes = BODY) -> Connection:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
        + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    return Connection(reader, writer, request)


async def measure(port: int, pid: int, num_requests: int, concurrency: int) -> dict[str, float]:
    single = await connect(port)
    for _ in range(50):  # warm-up
        await single.call()
    latencies = []
    for _ in range(num_requests // 4):
        start = time.perf_counter()
        await single.call()
        latencies.append(time.perf_counter() - start)
    connections = [await connect(port) for _ in range(concurrency)]
    per_connection = max(1, num_requests // concurrency)

    async def drive(connection: Connection) -> None:
        for _ in range(per_connection):
            await connection.call()

    cpu_before = process_cpu_seconds(pid)
    start = time.perf_counter()
    await asyncio.gather(*(drive(connection) for connection in connections))
    elapsed = time.perf_counter() - start
    cpu = process_cpu_seconds(pid) - cpu_before
    total = per_connection * concurrency
    for connection in (single, *connections):
        connection.writer.close()
    latencies.sort()
    return {
        "p50_us": statistics.median(latencies) * 1e6,
        "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
        "per_second": total / elapsed,
        "cpu_us": cpu / total * 1e6,
    }


def run_candidate(kind: str, libs: str | None, num_requests: int, concurrency: int) -> dict[str, float] | None:
    env = dict(os.environ)
    if libs:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), libs]))
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER, kind], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("listening on"):
            error = process.stderr.read() if process.stderr else ""
            print(f"{kind}: skipped ({error.strip().splitlines()[-1] if error.strip() else 'did not start'})")
            return None
        port = int(line.rsplit(":", 1)[1])
        return asyncio.run(measure(port, process.pid, num_requests, concurrency))
    finally:
        process.kill()
        process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--libs", help="folder holding the candidate libraries (added to the servers' PYTHONPATH)")
    parser.add_argument("--requests", type=int, default=3000, help="requests per candidate at concurrency C")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="runs per candidate, best kept (a busy machine)")
    args = parser.parse_args()
    print(f"{'server':<20} {'p50 us':>8} {'p99 us':>8} {'req/s':>8} {'CPU us/req':>11}")
    for kind in CANDIDATES:
        runs = [run_candidate(kind, args.libs, args.requests, args.concurrency) for _ in range(args.rounds)]
        kept = [run for run in runs if run is not None]
        if not kept:
            continue
        best = {
            "p50_us": min(run["p50_us"] for run in kept),
            "p99_us": min(run["p99_us"] for run in kept),
            "per_second": max(run["per_second"] for run in kept),
            "cpu_us": min(run["cpu_us"] for run in kept),
        }
        print(
            f"{kind:<20} {best['p50_us']:>8.0f} {best['p99_us']:>8.0f} {best['per_second']:>8.0f} "
            f"{best['cpu_us']:>11.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
