"""Cost cuts beside fixed cuts: ``ModelRuntime.infer_batch`` on the same random chunks, interleaved.

Two runtimes over the MiniLM sentiment handler (ONNX Runtime, CPU), one with
``BatchCuts.FIXED`` and one with ``BatchCuts.COST``, score the same random
chunks of reviews one after the other (the order alternates every chunk, so a
drift of the machine's speed hits both). Each runtime first scores
``--warmup-chunks`` chunks of the same size (model warm-up; the cost model fits
on them). Prints and writes (``--out``) ms per chunk of each, their ratio, and
the largest score difference between the two (the batches differ, so floats
may in the last bits).

    .venv/bin/python bench/batch_cuts.py --chunks 12,40,1024 --rounds 200
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def measure(texts: list[str], runtimes: dict, chunk: int, rounds: int, warmup: int, seed: int) -> dict:
    """ms per chunk of each runtime over the same ``rounds`` random chunks of ``chunk`` texts."""
    rng = np.random.default_rng(seed)
    for runtime in runtimes.values():
        for _ in range(warmup):
            runtime.infer_batch([texts[i] for i in rng.integers(0, len(texts), chunk)])
    seconds = dict.fromkeys(runtimes, 0.0)
    scores: dict[str, list[float]] = {name: [] for name in runtimes}
    for r in range(rounds):
        batch = [texts[i] for i in rng.integers(0, len(texts), chunk)]
        names = list(runtimes) if r % 2 == 0 else list(runtimes)[::-1]
        for name in names:
            start = time.perf_counter()
            out = runtimes[name].infer_batch(batch)
            seconds[name] += time.perf_counter() - start
            scores[name].extend(float(o.prediction[0]) for o in out)
    fitted = runtimes["cost"].batcher.cost_model.cost
    return {
        "chunk": chunk, "rounds": rounds,
        "ms_per_chunk": {name: 1000 * s / rounds for name, s in seconds.items()},
        "fixed_over_cost": seconds["fixed"] / seconds["cost"],
        "max_abs_score_diff": float(np.max(np.abs(np.subtract(scores["fixed"], scores["cost"])))),
        "fitted_ms": None if fitted is None else [1000 * fitted.per_call_s, 1000 * fitted.per_token_s],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the comparison for every chunk size; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", default="12,40,1024", help="texts per chunk, comma-separated")
    p.add_argument("--rounds", type=int, default=200,
                   help="chunks timed at 12 texts; larger chunks get proportionally fewer (at least 6)")
    p.add_argument("--warmup-chunks", type=int, default=30)
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "batch_cuts.json")
    args = p.parse_args(argv)

    from pyflink_aisp.datasets import load_rotten_tomatoes
    from pyflink_aisp.inference import BatchCuts, BatchingConfig, ModelRuntime
    from pyflink_aisp.inference.handlers import SentimentHandler
    from pyflink_aisp.models import ensure_model_assets

    assets = ensure_model_assets()
    texts = [r.text for r in load_rotten_tomatoes()]
    results = []
    for chunk in (int(c) for c in args.chunks.split(",")):
        runtimes = {
            cuts.value: ModelRuntime.acquire(SentimentHandler(assets, intra_op_num_threads=args.threads),
                                             BatchingConfig(max_batch_size=32, batch_cuts=cuts))
            for cuts in (BatchCuts.FIXED, BatchCuts.COST)
        }
        try:
            rounds = max(6, min(args.rounds, args.rounds * 12 // chunk))
            warmup = max(4, min(args.warmup_chunks, args.warmup_chunks * 12 // chunk))
            r = measure(texts, runtimes, chunk, rounds, warmup, seed=chunk)
        finally:
            for runtime in runtimes.values():
                runtime.release()
        results.append(r)
        ms = r["ms_per_chunk"]
        print(f"chunk {chunk:>5}: fixed {ms['fixed']:.1f} ms, cost {ms['cost']:.1f} ms, "
              f"{r['fixed_over_cost']:.2f}x; max |Δscore| {r['max_abs_score_diff']:.1e}; "
              f"fitted a, b = {r['fitted_ms']} ms", flush=True)
    args.out.write_text(json.dumps({"threads": args.threads, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
