"""``run_job``: submit the packaged job, wait for it, and write its run manifests.

A BATCH run resolves its input range first (:func:`~pyflink_aisp.pipeline.plan_input`),
reads exactly that range, says when it ends how many records of it were scored and
dead-lettered and why (one line; a second with the likely fix when most were dead
letters), and with ``--manifest-dir`` writes one manifest. With ``--max-dead-letter-rate``
a client submitted with ``flink run`` (attached) cancels the job at its first
:class:`~pyflink_aisp.errors.DeadLetterRateError` and exits 1 with its line (each
restart would replay the same records into the same failure). A stream with
``--manifest-dir`` writes one for each completed checkpoint that the submitting
client sees (it polls the Flink REST API about once a second while it runs attached;
a client started with ``flink run -d`` returns at once and writes none): the range
from where the stream started to the checkpoint's offsets, with the counts and
digests of the outcomes committed for it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from pyflink_aisp.alignment import (
    OutcomeTracker,
    RunManifest,
    TopicRange,
    checkpoint_offsets,
    code_version,
    completed_checkpoint,
    file_sha256,
    job_state,
    topic_offsets,
)
from pyflink_aisp.errors import AispError, ConfigError
from pyflink_aisp.inference import ModelHandler
from pyflink_aisp.outcome import Reason
from pyflink_aisp.pipeline._build import build_pipeline, make_environment
from pyflink_aisp.pipeline._config import InferenceOptions, PipelineOptions
from pyflink_aisp.pipeline._failfast import TERMINAL, check_dead_letter_rate, wait_failing_fast
from pyflink_aisp.pipeline._handlers import handler_for, model_assets
from pyflink_aisp.pipeline._options import Runner
from pyflink_aisp.pipeline._plan import InputPlan, group_or_earliest, plan_input, rest_url
from pyflink_aisp.pipeline._registry import load_registry
from pyflink_aisp.pipeline._remote_options import RemoteApi
from pyflink_aisp.pipeline._routes import route_plan
from pyflink_aisp.pipeline._settings import cluster_pipeline_depth
from pyflink_aisp.pipeline._watch import likely_fix

__all__ = ["model_files", "run_job"]

#: Configuration keys that tell where and how the job is submitted.
_CLIENT_KEYS = ("execution.target", "execution.attached", "rest.address", "rest.port",
                "jobmanager.rpc.address")


def model_files(options: InferenceOptions) -> dict[str, str]:
    """File name → sha256 of the model and tokenizer the options load (lineage to the weights);
    for ``--handler``, its ``module:Class`` → the handler's model version (its files are its own).

    Raises:
        ConfigError: A file cannot be read, or the handler cannot be built.
        ModelError: The sentiment assets cannot be found or built.
    """
    route = getattr(options, "route", None)
    if route is not None:  # every model of the route, by name
        registry = load_registry(options.models)  # type: ignore[attr-defined]  # a route: PipelineOptions
        return {f"{name}/{file}": sha for name in route_plan(registry, route).models
                for file, sha in model_files(registry.get(name).options).items()}
    if options.handler is not None:
        return {options.handler: handler_for(options).model_version()}
    if options.predictor is not None:
        return {options.predictor.name: file_sha256(options.predictor)}
    if options.remote_url is not None:  # the server owns the files: the model's URL and version
        handler = handler_for(options)
        route = "v2/models" if options.remote_api is RemoteApi.V2 else "v1/models"
        return {f"{options.remote_url.rstrip('/')}/{route}/{options.remote_model}": handler.model_version()}
    if options.encoder_onnx is not None and options.encoder_tokenizer is not None:
        return {options.encoder_onnx.name: file_sha256(options.encoder_onnx),
                options.encoder_tokenizer.name: file_sha256(options.encoder_tokenizer)}
    if options.classifier is not None:
        return {name: file_sha256(options.classifier / name)
                for name in ("model.onnx", "tokenizer.json", "config.json")}
    assets = model_assets(options)
    return {assets.onnx_path.name: assets.sha256, assets.tokenizer_path.name: assets.tokenizer_sha256}


def _manifest(options: PipelineOptions, span: TopicRange, tracker: OutcomeTracker,
              files: dict[str, str], checkpoint_id: int | None) -> RunManifest:
    return RunManifest(job_name=options.name, code_version=code_version(), mode=options.mode, range=span,
                       checkpoint_id=checkpoint_id, model_files=files, output_topic=options.output_topic,
                       dlq_topic=options.dlq, summary=tracker.summary(span))


def run_job(options: PipelineOptions, handler: ModelHandler[Any, Any, Any] | None = None, *,
            prog: str = "aisp-job") -> int:
    """Submit the job, and unless detached wait for it, writing its manifests.

    Args:
        options: The job's options.
        handler: Replaces the handler the options name.
        prog: Prefix of the progress lines (stdout) and of the one-line error (stderr).

    Returns:
        0 when the job was submitted (detached) or finished; 1 on a pyflink-aisp
        error, printed in one line on stderr.
    """
    def say(line: str) -> None:
        print(f"{prog}: {line}", flush=True)

    start = time.perf_counter()
    try:
        t_env = make_environment(options)
        config = {key: value for key in _CLIENT_KEYS if (value := t_env.get_config().get(key, ""))}
        plan = plan_input(options, config=config)
        if plan.span is not None:
            say(f"input range {_describe(plan.span)}")
        files = model_files(options) if options.manifest_dir else {}
        remote = config.get("execution.target") == "remote" or options.flink_rest_url
        if options.manifest_dir and not options.bounded and not remote:
            raise ConfigError("stream manifests need the Flink REST API: submit with `flink run` or pass "
                              "--flink-rest-url")
        before = _topic_ends(options) if options.bounded else {}
        result = build_pipeline(t_env, options, handler, plan=plan)
        client = result.get_job_client()
        job_id = str(client.get_job_id()) if client is not None else "?"
        say(f"job {job_id} submitted ({options.mode}, {_operator_line(options, t_env)}); "
            f"output {options.output_topic}, dead letters {options.dlq}")
        if config.get("execution.attached", "true") == "false":
            return 0  # `flink run -d`: the job runs on; stop it with `flink stop`
        fail_fast = options.max_dead_letter_rate is not None and config.get("execution.target") == "remote"
        if not options.bounded and options.manifest_dir is not None:
            _watch_checkpoints(options, plan, files, rest_url(options, config), job_id, say, fail_fast)
        if fail_fast:
            wait_failing_fast(rest_url(options, config), job_id)
        result.wait()
        took = f"job {job_id} finished in {time.perf_counter() - start:.1f} s"
        if options.bounded and plan.span is not None:
            _batch_summary(options, plan.span, files, took, say, before)
        else:
            say(took)
    except AispError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def _operator_line(options: PipelineOptions, t_env: Any) -> str:
    """``"arrow operator"``; for the record operator also its ``--pipeline-depth`` as the job runs
    it (:func:`~pyflink_aisp.pipeline._settings.cluster_pipeline_depth`)."""
    if options.operator is not Runner.RECORD:
        return f"{options.operator.value} operator"
    get = t_env.get_config().get
    depth = cluster_pipeline_depth(options, get).concurrent_runs
    slots = get("taskmanager.numberOfTaskSlots", "")
    target = get("execution.target", "local")
    where = f"{target}, {slots} slots per TaskManager" if slots else target
    return f"record operator, pipeline depth {depth} ({where})"


def _describe(span: TopicRange) -> str:
    return f"{span.topic} " + " ".join(f"[{p.partition}]:{p.start}-{p.end}" for p in span.partitions)


def _topic_ends(options: PipelineOptions) -> dict[str, dict[int, int]]:
    """The output and dead-letter topics' ends now (none for a topic not there yet)."""
    ends = {}
    for topic in (options.output_topic, options.dlq):
        try:
            ends[topic] = dict(topic_offsets(options.servers, topic).latest)
        except AispError:
            continue
    return ends


def _batch_summary(options: PipelineOptions, span: TopicRange, files: dict[str, str], took: str,
                   say: Callable[[str], None], before: dict[str, dict[int, int]]) -> None:
    """Say what this batch run wrote for its range (outcomes past ``before``, the topics' ends
    when it started: in, out, dead letters by reason, and the likely fix when most were dead
    letters); with ``--manifest-dir`` write its manifest (every outcome of the job for the range)."""
    if options.manifest_dir is not None:
        _write_batch_manifest(options, span, files, say)
    tracker = OutcomeTracker(options.servers, span.topic, options.output_topic, options.dlq, job=options.name,
                             starts=before)
    try:
        tracker.advance()
        counts = tracker.outcome_counts(span)
        reasons = tracker.dead_letter_reasons(span)
    except AispError as exc:
        say(f"{took} (its outcomes could not be counted: {exc})")
        return
    finally:
        tracker.close()
    out, dead = counts
    inputs = out + dead  # one outcome per input record, exactly once
    why = f" ({', '.join(f'{r} {n}' for r, n in reasons.most_common())})" if reasons else ""
    say(f"{took}: {inputs} in, {out} out, {dead} dead letters{why}")
    if inputs and dead / inputs > options.dead_letter_watch().warn_share and reasons:
        top = reasons.most_common(1)[0][0]
        fix = likely_fix(Reason(top)) if top in set(Reason) else "see the dead letters' detail"
        say(f"warning: {100 * dead / inputs:.0f} % of the range was dead-lettered, most as {top}: {fix}")


def _write_batch_manifest(options: PipelineOptions, span: TopicRange, files: dict[str, str],
                          say: Callable[[str], None]) -> None:
    tracker = OutcomeTracker(options.servers, span.topic, options.output_topic, options.dlq, job=options.name)
    try:
        tracker.advance()
        manifest = _manifest(options, span, tracker, files, None)
    finally:
        tracker.close()
    assert options.manifest_dir is not None
    path = manifest.write(options.manifest_dir)
    s = manifest.summary
    say(f"manifest {path}: {s.input_count} in, {s.output_count} out, {s.dlq_count} dead letters")


def _checkpoint_manifest(options: PipelineOptions, starts: dict[int, int], files: dict[str, str], rest: str,
                         tracker: OutcomeTracker, say: Callable[[str], None]) -> int:
    """Write the manifest of the job's last completed checkpoint; returns its id."""
    servers = options.servers
    topic = options.input_topic
    offsets = topic_offsets(servers, topic)
    read_group = partial(group_or_earliest, servers, options.group, offsets)
    position = checkpoint_offsets(rest, options.name, read_group)
    tracker.advance()
    span = TopicRange.between(topic, starts, position.offsets)
    manifest = _manifest(options, span, tracker, files, position.checkpoint_id)
    assert options.manifest_dir is not None
    path = manifest.write(options.manifest_dir)
    say(f"checkpoint {position.checkpoint_id}: manifest {path} ({manifest.summary.input_count} in)")
    return position.checkpoint_id


def _watch_checkpoints(options: PipelineOptions, plan: InputPlan, files: dict[str, str], rest: str,
                       job_id: str, say: Callable[[str], None], fail_fast: bool = False) -> None:
    """Write a manifest for each newly completed checkpoint until the job ends (with
    ``fail_fast``, cancel it at its first dead-letter-rate failure:
    :func:`~pyflink_aisp.pipeline._failfast.check_dead_letter_rate`)."""
    servers = options.servers
    topic = options.input_topic
    assert plan.stream_starts is not None and options.manifest_dir is not None
    tracker = OutcomeTracker(servers, topic, options.output_topic, options.dlq, job=options.name)
    written, failed = None, None
    try:
        while job_state(rest, job_id) not in TERMINAL:
            if fail_fast:
                check_dead_letter_rate(rest, job_id)
            latest = completed_checkpoint(rest, job_id)
            if latest is not None and latest[0] != written:
                try:
                    written = _checkpoint_manifest(options, plan.stream_starts, files, rest, tracker, say)
                except AispError as exc:  # the job goes on; so do its manifests, at the next checkpoint
                    if str(exc) != failed:
                        say(f"checkpoint {latest[0]}: no manifest: {exc}")
                    failed = str(exc)
            time.sleep(1.0)
    finally:
        tracker.close()

