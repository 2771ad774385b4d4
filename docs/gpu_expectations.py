"""The expected GPU throughput of docs/gpu.md, computed from last turn's H200 measurements.

These are EXPECTATIONS, not measurements: they hold until ``bench/gpu_check.sh`` runs the pipelined path on
a lent H200. ``python docs/gpu_expectations.py`` prints the table; a unit test
(``tests/unit/pipeline/test_device_defaults.py``) checks that :data:`EXPECTED` is what :func:`expected`
computes, so the page's numbers (this file is one of its sources) cannot drift from the model.

The measurements (H200, all-MiniLM-L6-v2 with the sentiment head, 51,232 reviews of mean 27 tokens; issue 23
and the project's architecture notes):

* a cost model fitted to the eager handler: about 5 ms per model call plus 0.55 us per padded token (fp32);
* a plain PyTorch loop, tokenization included: 34,800 sentences/s fp32, 48,900 bf16 (batches of 1,024);
* the forward pass alone: 45,300 fp32, 100,900 bf16;
* HF tokenizers ``encode_batch`` on 16 cores: 159,000 sentences/s;
* bf16 in batches of 256 through today's path: 8,200 sentences/s (a new shape nearly every call);
* the same cost model put today's path at about 5,000 sentences/s at the default batch of 32, 17,000-21,000
  fp32 and 20,000-28,000 bf16 at batches of 256-1,024; the torch handler measured 18,800-20,300 in chunks of
  1,024.

The model of the pipelined path (launch batch n+1 while batch n computes, few shapes, no hidden sync):

* device time per batch of ``b`` rows: ``FIXED_MS + b * PADDED_TOKENS * us_per_token`` (the fixed part
  kept per call: not hidden, a conservative choice);
* host time per row (tokenize, pad, copy, build the results) = the plain loop's time per row less the
  forward's; the larger of fp32's and bf16's (10.5 us) is taken for both;
* with depth 2 the host's work overlaps the device's, so the rate is the slower stage's:
  ``min(b / device time, 1 / host time)``.

bf16's cost per token is not measured directly: it is what makes the cost model give the forward-only rate
(100,900) at batch 1,024, as the fp32 model gives 44,500 there against the measured 45,300.
"""

from __future__ import annotations

#: Fixed cost per eager model call, ms (fitted, H200).
FIXED_MS = 5.0
#: fp32 cost per padded token, us (fitted, H200).
FP32_US_PER_TOKEN = 0.55
#: Padded tokens per row assumed: reviews of mean 27 tokens in length-sorted batches, padded to 16s.
PADDED_TOKENS = 32
#: Measured sentences/s on the H200: the plain loop (tokenization included) and the forward alone.
PLAIN_LOOP = {"fp32": 34_800, "bf16": 48_900}
FORWARD_ONLY = {"fp32": 45_300, "bf16": 100_900}
#: Batch size of the plain loop and forward-only runs.
MEASURED_BATCH = 1024
#: tokenizers encode_batch on 16 cores, sentences/s.
TOKENIZE_16_CORES = 159_000
#: The batch sizes of the page's table.
BATCHES = (32, 256, 1024)

#: Expected sentences/s of the pipelined path by precision and batch (rounded to 100), as :func:`expected`
#: computes them (checked by a test).
EXPECTED = {
    "fp32": {32: 5_800, 256: 26_900, 1024: 44_500},
    "bf16": {32: 6_200, 256: 40_700, 1024: 94_900},
}
#: The host's bound (1 / host time per row), sentences/s, rounded to 100.
HOST_BOUND = 94_900
#: bf16's cost per padded token, us, rounded to 3 places (derived, see the module docstring).
BF16_US_PER_TOKEN = 0.157


def us_per_token(precision: str) -> float:
    """Device cost per padded token in us: fitted for fp32; for bf16 the value that gives the forward-only
    rate at :data:`MEASURED_BATCH`."""
    if precision == "fp32":
        return FP32_US_PER_TOKEN
    batch_ms = 1000 * MEASURED_BATCH / FORWARD_ONLY[precision]
    return 1000 * (batch_ms - FIXED_MS) / (MEASURED_BATCH * PADDED_TOKENS)


def host_us_per_row() -> float:
    """Host time per row in us: the plain loop's time per row less the forward's (the larger of fp32's
    and bf16's)."""
    return max(1e6 / PLAIN_LOOP[p] - 1e6 / FORWARD_ONLY[p] for p in PLAIN_LOOP)


def expected(precision: str, batch: int) -> float:
    """Sentences/s of the pipelined path: the slower of the device (``batch`` per device time) and the
    host."""
    device_ms = FIXED_MS + batch * PADDED_TOKENS * us_per_token(precision) / 1000
    return min(1000 * batch / device_ms, 1e6 / host_us_per_row())


def main() -> None:
    for precision in EXPECTED:
        row = ", ".join(f"batch {b}: {expected(precision, b):,.0f}/s" for b in BATCHES)
        print(f"{precision}: {row}")
    print(f"host bound {1e6 / host_us_per_row():,.0f}/s; bf16 {us_per_token('bf16'):.4f} us per token")


if __name__ == "__main__":
    main()
