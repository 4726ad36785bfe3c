"""Generation speed in new tokens/s: local transformers unbatched vs batched, and an
OpenAI-compatible server (`transformers serve`) at concurrency 1 and 8.

(a) `training.generation.TransformersBackend` on N prompts, once with batch_size 1 and once
    with `--batch-size` (left padding), K=1.
(b) `training.generation.openai.OpenAICompatibleBackend` against a `transformers serve`
    process this script starts on a loopback port with the same folder, at concurrency 1
    and 8 (`--continuous-batching` passes that flag to the server).
New tokens are those each candidate records (`usage.completion_tokens`: the server's own
count, or the local backend's count up to EOS).
The policy is a tiny GPT-2 built from a config (4 layers, 128 wide; no hub), or `--model`
a transformers folder (e.g. the SmolLM2 folder of ../shared/MODELS.md). The 1-minute load
average is printed beside each figure: the machine is shared.

    .venv/bin/python benchmarks/generation_bench.py
    .venv/bin/python benchmarks/generation_bench.py --model var/models/smollm2 --prompts 16

Reference runs (defaults: tiny 4-layer policy, 32 prompts, up to 32 new tokens each, batch
16, 2 threads; 2 CPU cores shared with other jobs, 1-minute load average 9-12), new tokens/s:

    run                                 (a) unbatched  batched(16)  (b) conc. 1  conc. 8
    plain `transformers serve`                   10.6         41.2         15.3     19.6
    `--continuous-batching`                      19.3         66.0         18.5     43.0

Column (a) does not use the server: its two rows differ by the machine's load alone.
Batching local generation gives 3.4-3.9x. The plain server runs one request at a time, so
concurrency 8 gains little (1.3x); with continuous batching it gains 2.3x. A GPU server
(vLLM, SGLang) batches far more; these figures only rank the settings on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="policy folder (default: tiny)")
    parser.add_argument("--prompts", type=int, default=32, help="number of prompts")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16, help="batched run's batch size")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, here and served")
    parser.add_argument("--skip-server", action="store_true", help="only (a)")
    parser.add_argument(
        "--continuous-batching", action="store_true", help="serve with --continuous-batching"
    )
    return parser.parse_args(argv)


def tiny_policy(folder: Path) -> Path:
    """Build a 4-layer, 128-wide GPT-2 on a tokenizer of the demo's texts; sample by default."""
    from training import demo
    from training.trainers.tiny import build_tiny_causal_lm, train_tokenizer

    tokenizer = train_tokenizer(demo.tokenizer_training_texts(), vocab_size=300)
    build_tiny_causal_lm(tokenizer, folder, n_layer=4, n_embd=128, n_head=4, n_positions=256)
    return folder


def served_copy(model: Path, work: Path) -> Path:
    """Return a copy of the folder whose generation config samples (serve reads do_sample there)."""
    folder = work / "served"
    shutil.copytree(model, folder)
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**config, "do_sample": True}))
    return folder


def prompts_of(n: int) -> list[str]:
    return [f"What is {i} + {2 * i + 1}? Explain briefly." for i in range(n)]


def load() -> float:
    return os.getloadavg()[0]


def new_tokens(out) -> int:
    """Return the tokens generated, as each candidate records them (the server's usage)."""
    return sum(c["generation_config"]["response"]["usage"]["completion_tokens"] for c, *_ in out)


def local_rate(model: Path, prompts, *, batch_size: int, max_new_tokens: int) -> tuple[float, int]:
    """Return (new tokens/s, new tokens) of the transformers backend at one batch size."""
    from training.generation import GenerationSettings, TransformersBackend

    settings = GenerationSettings(max_new_tokens=max_new_tokens, batch_size=batch_size, seed=1)
    backend = TransformersBackend(model)
    backend.generate(prompts[:2], k=1, settings=settings)  # load caches, warm up
    started = time.perf_counter()
    out = backend.generate(prompts, k=1, settings=settings)
    seconds = time.perf_counter() - started
    tokens = new_tokens(out)
    return tokens / seconds, tokens


def start_server(
    folder: Path, threads: int, log_path: Path, *, continuous_batching: bool = False
) -> tuple[subprocess.Popen, str]:
    """Start `transformers serve` on a free loopback port; return (process, base URL)."""
    import requests

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    command = [str(Path(sys.executable).with_name("transformers")), "serve"]
    command += ["--host", "127.0.0.1", "--port", str(port), str(folder)]
    if continuous_batching:
        command.append("--continuous-batching")
    process = subprocess.Popen(
        command, stdout=log_path.open("w"), stderr=subprocess.STDOUT, env=env
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"transformers serve exited; see {log_path}")
        try:
            if requests.get(f"{url}/health", timeout=2).ok:
                return process, url
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    process.terminate()
    raise SystemExit("transformers serve did not come up in 300 s")


def server_rate(url: str, model: str, prompts, *, concurrency: int, max_new_tokens: int):
    """Return (new tokens/s, new tokens) through the endpoint backend at one concurrency."""
    from training.generation import GenerationSettings
    from training.generation.openai import EndpointClientSettings, OpenAICompatibleBackend

    backend = OpenAICompatibleBackend(
        endpoint="bench",
        base_url=url,
        model=model,
        client=EndpointClientSettings(concurrency=concurrency, timeout_seconds=600, retries=0),
    )
    settings = GenerationSettings(max_new_tokens=max_new_tokens, seed=1)
    backend.generate(prompts[:2], k=1, settings=settings)  # warm up
    started = time.perf_counter()
    out = backend.generate(prompts, k=1, settings=settings)
    seconds = time.perf_counter() - started
    tokens = new_tokens(out)
    return tokens / seconds, tokens


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="generation-bench-"))
    try:
        model = args.model.resolve() if args.model else tiny_policy(work / "policy")
        prompts = prompts_of(args.prompts)
        print(f"policy {model}; {len(prompts)} prompts, {args.max_new_tokens} new tokens max")
        for label, batch in (("unbatched", 1), (f"batched ({args.batch_size})", args.batch_size)):
            before = load()
            rate, tokens = local_rate(
                model, prompts, batch_size=batch, max_new_tokens=args.max_new_tokens
            )
            print(
                f"(a) transformers {label:>13}: {rate:7.1f} new tokens/s ({tokens} tokens), "
                f"load {before:.1f}->{load():.1f}"
            )
        if args.skip_server:
            return
        folder = served_copy(model, work)
        process, url = start_server(
            folder,
            args.threads,
            work / "serve.log",
            continuous_batching=args.continuous_batching,
        )
        try:
            for concurrency in (1, 8):
                before = load()
                rate, tokens = server_rate(
                    url,
                    str(folder),
                    prompts,
                    concurrency=concurrency,
                    max_new_tokens=args.max_new_tokens,
                )
                print(
                    f"(b) transformers serve, concurrency {concurrency}: {rate:7.1f} new "
                    f"tokens/s ({tokens} tokens), load {before:.1f}->{load():.1f}"
                )
        finally:
            process.terminate()
            process.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
