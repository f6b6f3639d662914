"""`dpgate generate "PROMPT"`: stream a completion from a running server to the terminal."""

from __future__ import annotations

import argparse
import sys

import grpc

from dpgate.v1 import generate_pb2
from gateway.client import DpgateClient, GenerationOptions

FINISH_NAMES = {
    generate_pb2.FINISH_REASON_LENGTH: "length",
    generate_pb2.FINISH_REASON_STOP: "stop",
    generate_pb2.FINISH_REASON_ABORTED: "aborted",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="prompt text")
    parser.add_argument("--address", default="127.0.0.1:50051", help="server HOST:PORT (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens to generate (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=None, help="0 for greedy (default: the server's)")
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--rank", default=None, help="pin the call to this data-parallel rank")
    parser.add_argument("--api-key", default=None, help="sent as `authorization: Bearer KEY`")
    parser.add_argument("--timeout", type=float, default=None, help="deadline in seconds")
    parser.add_argument("--verbose", action="store_true", help="print the finish reason and token counts")


def run(args: argparse.Namespace) -> int:
    options = GenerationOptions(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
    )
    with DpgateClient(args.address, rank=args.rank, api_key=args.api_key) as client:
        try:
            for message in client.stream(args.prompt, options, timeout=args.timeout):
                if message.HasField("delta"):
                    sys.stdout.write(message.delta.text)
                    sys.stdout.flush()
                elif message.HasField("finish"):
                    sys.stdout.write("\n")
                    if args.verbose:
                        finish = message.finish
                        print(
                            f"[finish: {FINISH_NAMES.get(finish.reason, 'unknown')}, "
                            f"{finish.num_prompt_tokens} prompt + {finish.num_generated_tokens} generated tokens]",
                            file=sys.stderr,
                        )
        except grpc.RpcError as error:
            print(f"\ndpgate generate: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
    return 0
