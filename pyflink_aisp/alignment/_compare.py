"""Verifying two manifests: their input ranges must be the same, each run must
have written exactly one outcome per input record (no duplicate, none
missing), and their input, output and dead-letter counts must agree. Equal
digests prove equal bytes; where they differ, the outcomes of the range are
read back from the two output topics (by their lineage headers) and compared
per id (label, model version, score within the tolerance): the two runtime
modes batch records differently, so scores may differ in the last float bits."""

from __future__ import annotations

from pathlib import Path

from pyflink_aisp.alignment._manifest import OutcomeTracker, RunManifest
from pyflink_aisp.alignment._verify import compare_outputs

__all__ = ["verify_manifests"]


def _range_outputs(servers: str, manifest: RunManifest) -> list[bytes]:
    tracker = OutcomeTracker(servers, manifest.range.topic, manifest.output_topic, manifest.dlq_topic,
                             job=manifest.job_name)
    try:
        tracker.advance()
        return tracker.outputs(manifest.range)
    finally:
        tracker.close()


def verify_manifests(path_a: Path, path_b: Path, *, servers: str, tolerance: float) -> tuple[bool, list[str]]:
    """Compare two runs by their manifests (see the module docstring).

    Returns:
        Whether they agree, and the lines to print.

    Raises:
        ConfigError: A manifest cannot be read.
        KafkaError: Their output topics cannot be read (only when the digests differ).
    """
    a, b = RunManifest.read(path_a), RunManifest.read(path_b)
    lines = []
    for side, m, path in (("a", a, path_a), ("b", b, path_b)):
        s = m.summary
        where = m.mode if m.checkpoint_id is None else f"{m.mode}, checkpoint {m.checkpoint_id}"
        lines.append(f"{side}: {path} ({where}): {s.input_count} in, "
                     f"{s.output_count} out, {s.dlq_count} dead letters, {s.duplicates} duplicated, "
                     f"{s.missing} missing, model {', '.join(s.model_versions) or '-'}")
    problems = []
    if a.range != b.range:
        problems.append(f"the input ranges differ: a {a.range.to_json()} b {b.range.to_json()}")
    for side, m in (("a", a), ("b", b)):
        if m.summary.duplicates or m.summary.missing:
            problems.append(f"run {side} is not exactly once: {m.summary.duplicates} input records with "
                            f"several outcomes, {m.summary.missing} with none")
    sa, sb = a.summary, b.summary
    if (sa.input_count, sa.output_count, sa.dlq_count) != (sb.input_count, sb.output_count, sb.dlq_count):
        problems.append("the counts differ")
    if sa.dlq_digest != sb.dlq_digest:
        problems.append("the dead letters differ")
    if not problems:
        if sa.output_digest == sb.output_digest:
            lines.append(f"output digests equal ({sa.output_digest[:16]}…): byte-identical outputs")
        else:
            lines.append("output digests differ: comparing the outputs per id")
            report = compare_outputs(_range_outputs(servers, a), _range_outputs(servers, b),
                                     tolerance=tolerance)
            lines.extend(line for line in report.lines() if line not in ("SAME", "DIFFERENT"))
            if not report.ok:
                problems.append("the outputs differ")
    lines.extend(problems)
    lines.append("DIFFERENT" if problems else "SAME")
    return not problems, lines
