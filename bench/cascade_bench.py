"""Routing (issue 26): a model cascade on the labelled reviews, against each of its models alone.

Not a test. Two models answer "is this review fresh or rotten?": **A**, the project's sentiment
model (MiniLM + logistic head, ONNX Runtime in process,
:class:`~pyflink_aisp.inference.handlers.SentimentHandler` behind a ``ModelRuntime``), and a second
model **B**, one of (``--b``, comma-separated; each measured on its own):

* ``smollm``: a generation model on an OpenAI-compatible server: llama.cpp's ``llama-server``
  serving SmolLM2-135M-Instruct (Q4_1 GGUF, ``make servers``), asked through
  :class:`~pyflink_aisp.inference.handlers.remote.OpenAIGenerationHandler` (chat, greedy) with a JSON
  schema whose ``label`` is an enum of ``fresh`` / ``rotten`` (structured output): its ``label`` field
  is B's answer. A record B dead-letters (e.g. an ``invalid_model_output``) counts as wrong.
* ``lexicon``: the word lexicon of ``jobs/examples/lexicon_handler.py`` (binarised naive Bayes
  log-count ratios, :class:`LexiconSentimentHandler` behind a ``ModelRuntime``, in process), trained
  here on the **train** part of the same split as A (the model's build manifest's seed and fraction),
  so no dev or test review is among its training reviews (checked by id; the text duplicates across
  the split are counted in the report).

The cascade is :class:`~pyflink_aisp.inference.routing.CascadeNode` with one stage (A, confidence
:attr:`Confidence.MARGIN <pyflink_aisp.inference.routing.Confidence>` = ``|P(fresh) - P(rotten)|``)
and B last, run through :func:`~pyflink_aisp.inference.routing.run_route` on batches of ``--batch``
records (as the Arrow operator sends them), one batch after another; the submit dispatches to each
model's ``ModelRuntime.submit_batch``. Its three thresholds are A's margin quantiles on the **dev**
sample at ``--escalate`` (default 10 / 25 / 50 % of records escalated), the same for every B, so the
test sample's escalation shares are an out-of-sample check of them.

Data: reviews of the sentiment model's held-out split only (``split_reviews`` with the seed and
fraction of the model's own build manifest), shuffled once: the first ``--dev`` are the dev sample
(thresholds; B's prompt, when several ``--prompts`` are given), the next ``--test`` the test sample
(every number in the table). Nothing is tuned on the test sample.

Runs per B, each over the whole test sample: A alone, B alone, the cascade at each threshold; each
run that calls SmolLM gets a fresh ``llama-server`` (it keeps prompts it has seen, which would
flatter a second run over the same texts), each run that calls the lexicon a fresh runtime; B is
warmed on dev records before the clock starts. Reported per run: accuracy (the answering model's
label == the true label), records escalated (calls to B), records/s (wall, B included) and B's share
of the wall time (the union of the spans from B's submit to its answer). The report also gives A's
and B's accuracy on the records each threshold escalates (a cascade gains only where B beats A
there) and McNemar's exact tests: B alone against A alone, each cascade against A alone and against
B alone.

Run (about 11 min on 2 cores, most of it SmolLM; ``--b lexicon`` about 1 min)::

    .venv/bin/python bench/cascade_bench.py [--b smollm,lexicon] [--test 600] [--dev 100] [--batch 64]

It prints the machine, writes ``## Routing: a cascade on the reviews`` into ``bench/REPORT.md``,
the plot ``bench/cascade_accuracy.png`` (accuracy against calls to B, every B) and the raw numbers
``bench/cascade_results.json`` (one entry per B under ``bs``, each with its own machine line and run
time). A run of some Bs **merges** into that file: the stored results of the other Bs are kept when
they were measured on the same samples and thresholds (``--b lexicon`` leaves the SmolLM results as
they are). ``--report-only`` writes the section and plot again from the file.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
from _markdown import replace_section
from _report import machine
from scipy.stats import binomtest

from pyflink_aisp.datasets import Review, load_rotten_tomatoes, split_reviews
from pyflink_aisp.inference import BatchingConfig, Inferred, ModelRuntime
from pyflink_aisp.inference.handlers import SentimentHandler
from pyflink_aisp.inference.handlers.remote import LimiterConfig, OpenAIGenerationHandler
from pyflink_aisp.inference.routing import (
    CascadeNode,
    CascadeStage,
    Confidence,
    ModelNode,
    Routed,
    RouteNode,
    RouteRecord,
    Step,
    confidence_of,
    run_route,
)
from pyflink_aisp.models import ensure_model_assets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "servers"))
import launch  # noqa: E402  (tests/servers: the llama-server launcher)

sys.path.insert(0, str(ROOT / "jobs" / "examples"))
import lexicon_handler  # noqa: E402  (jobs/examples: the lexicon model and its handler)

SECTION = "## Routing: a cascade on the reviews"
PNG = "cascade_accuracy.png"
RESULTS = "cascade_results.json"
#: The Bs, in the report's order: ``name -> (short name, plot colour)``.
BS: dict[str, tuple[str, str]] = {"smollm": ("SmolLM2-135M on llama-server", "tab:red"),
                                  "lexicon": ("the word lexicon (naive Bayes)", "tab:purple")}
#: What a stored B's results must share with a new run's to be reported beside them.
SAME = ("model_sha256", "test", "dev", "batch", "split")
LEXICON_MIN_COUNT, LEXICON_ALPHA = 2, 1.0  # lexicon_handler.train_lexicon's defaults
ALIAS = "smollm2"
LABELS = ("rotten", "fresh")  # by Review.label
SCHEMA = {"type": "object", "properties": {"label": {"type": "string", "enum": ["fresh", "rotten"]}},
          "required": ["label"]}
_FRESH_FIRST = ('You label movie reviews. Reply {"label": "fresh"} if the critic liked the movie, '
                '{"label": "rotten"} if not.')
_ROTTEN_FIRST = ('You label movie reviews. Reply {"label": "rotten"} if the critic disliked the movie, '
                 '{"label": "fresh"} if they liked it.')
_QUESTION = "Review: {text}\nWas this review negative (rotten) or positive (fresh)?"
#: B's prompt candidates: ``name -> (system prompt, prompt template)``; with several ``--prompts`` the
#: best on the dev sample is used. Each system prompt shows the JSON answer: without one SmolLM2 pads
#: the grammar's JSON with whitespace until ``max_tokens`` cuts it (an ``invalid_model_output``). Left
#: out after one dev run: ``_ROTTEN_FIRST`` with ``_QUESTION`` alone (dev accuracy 0.21, 66 of 100
#: records dead-lettered).
PROMPTS: dict[str, tuple[str | None, str]] = {
    "fresh-first": (_FRESH_FIRST, "{text}"),
    "few-shot": (_ROTTEN_FIRST, 'Review: dull, clumsy and far too long.\n{"label": "rotten"}\n'
                                'Review: a dazzling, heartfelt triumph.\n{"label": "fresh"}\n' + _QUESTION),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--b", default=",".join(BS), help=f"comma-separated Bs to run, of {', '.join(BS)}; "
                   "the stored results of the others are kept")
    p.add_argument("--test", type=int, default=600, help="test reviews (every reported number)")
    p.add_argument("--dev", type=int, default=100, help="dev reviews (thresholds, B's prompt)")
    p.add_argument("--batch", type=int, default=64, help="records per run_route call")
    p.add_argument("--escalate", type=float, nargs="+", default=[0.10, 0.25, 0.50],
                   help="dev shares escalated that pick the thresholds")
    p.add_argument("--prompts", nargs="+", default=list(PROMPTS), choices=list(PROMPTS),
                   help="B's prompt; several: the best on the dev sample")
    p.add_argument("--max-tokens", type=int, default=12, help="B's most generated tokens per record")
    p.add_argument("--parallel", type=int, default=4, help="llama-server slots = B's requests in flight")
    p.add_argument("--rounds", type=int, default=5,
                   help="rounds over every run when B is in process (lexicon): records/s is the median "
                        "of the rounds; a SmolLM group runs once (minutes per run)")
    p.add_argument("--seed", type=int, default=26, help="the held-out split's shuffle")
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench")
    p.add_argument("--report-only", action="store_true",
                   help=f"write the section and plot again from OUT_DIR/{RESULTS}; run nothing")
    args = p.parse_args(argv)
    args.b = [x.strip() for x in args.b.split(",") if x.strip()]
    if not args.b or set(args.b) - set(BS) or len(set(args.b)) != len(args.b):
        p.error(f"--b takes one or more of {', '.join(BS)}")
    return args


def samples(assets: Any, args: argparse.Namespace
            ) -> tuple[list[Review], list[Review], dict[str, Any], list[Review]]:
    """``(dev, test, split, train)``: dev and test from the model's held-out split (its build
    manifest's seed and fraction), train the other part of that split (the lexicon's training data)."""
    recipe = json.loads((assets.directory / "manifest.json").read_text())["recipe"]
    train, heldout = split_reviews(load_rotten_tomatoes(), seed=recipe["split_seed"],
                                   heldout_fraction=recipe["heldout_fraction"])
    if len(heldout) != assets.heldout_size or args.dev + args.test > len(heldout):
        raise SystemExit(f"held-out split: {len(heldout)} reviews (manifest {assets.heldout_size}); "
                         f"asked {args.dev} + {args.test}")
    order = np.random.default_rng(args.seed).permutation(len(heldout))
    picked = [heldout[i] for i in order[: args.dev + args.test]]
    split = {"split_seed": recipe["split_seed"], "heldout_fraction": recipe["heldout_fraction"],
             "heldout": len(heldout), "shuffle_seed": args.seed}
    return picked[: args.dev], picked[args.dev:], split, train


class Dispatch:
    """The route's submit: ``runtimes[name].submit_batch``, timing each model's calls (the union of
    the spans from submit to answer, per model, in seconds)."""

    def __init__(self, runtimes: dict[str, ModelRuntime]) -> None:
        self.runtimes = runtimes
        self.spans: dict[str, list[tuple[float, float]]] = {name: [] for name in runtimes}
        self.calls: Counter[str] = Counter()
        self.records: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, model: str, inputs: Sequence[Any]) -> Future[list[Any]]:
        start = time.perf_counter()
        future = self.runtimes[model].submit_batch(list(inputs))

        def done(_: Future[list[Any]]) -> None:
            with self._lock:
                self.spans[model].append((start, time.perf_counter()))

        with self._lock:
            self.calls[model] += 1
            self.records[model] += len(inputs)
        future.add_done_callback(done)
        return future

    def busy_s(self, model: str) -> float:
        """Seconds in which a call of ``model`` was in flight."""
        total, end = 0.0, -np.inf
        for s, e in sorted(self.spans[model]):
            total += max(0.0, e - max(s, end))
            end = max(end, e)
        return total


def route_all(node: RouteNode, reviews: Sequence[Review], dispatch: Dispatch,
              batch: int) -> tuple[list[Routed], float]:
    """Every review's answer through ``node``, ``batch`` records per ``run_route``; the wall seconds."""
    records = [RouteRecord(model_input=r.text, text=r.text) for r in reviews]
    start = time.perf_counter()
    answers: list[Routed] = []
    for i in range(0, len(records), batch):
        answers += run_route(node, records[i:i + batch], dispatch)
    return answers, time.perf_counter() - start


def label_of(answer: Routed, tasks: dict[str, Any]) -> str | None:
    """The answering model's label (its task's ``label`` field); None for a dead letter."""
    if isinstance(answer.outcome, BaseException):
        return None
    return tasks[answer.model].render(answer.outcome.prediction)["label"]


def margin_of(step: Step, task: Any) -> float:
    """A's margin for one record: the cascade's own, else measured from A's prediction."""
    if step.confidence is not None:
        return step.confidence
    return confidence_of(task.probabilities(step.outcome.prediction), Confidence.MARGIN)


def summarise(name: str, reviews: Sequence[Review], answers: list[Routed], wall_s: float,
              dispatch: Dispatch, tasks: dict[str, Any], **extra: Any) -> dict[str, Any]:
    labels = [label_of(a, tasks) for a in answers]
    correct = [lab == LABELS[r.label] for r, lab in zip(reviews, labels, strict=True)]
    dead = [type(a.outcome).__name__ for a in answers if isinstance(a.outcome, BaseException)]
    margins = [next((margin_of(s, tasks["a"]) for s in a.trail if s.model == "a"), None) for a in answers]
    return {
        "run": name, "records": len(reviews), "accuracy": float(np.mean(correct)),
        "escalated": dispatch.records.get("b", 0), "answered_by": dict(Counter(a.model for a in answers)),
        "dead_letters": len(dead), "dead_letter_kinds": dict(Counter(dead)),
        "wall_s": wall_s, "records_per_s": len(reviews) / wall_s,
        "b_busy_s": dispatch.busy_s("b") if "b" in dispatch.spans else 0.0,
        "b_share": (dispatch.busy_s("b") / wall_s) if "b" in dispatch.spans else 0.0,
        "calls": dict(dispatch.calls), "load_1min": os.getloadavg()[0],
        "labels": labels, "correct": correct, "margins": margins,
        "escalated_rows": [i for i, a in enumerate(answers) if a.model == "b"], **extra}


def b_runtime(url: str, args: argparse.Namespace, prompt: str) -> ModelRuntime:
    system, template = PROMPTS[prompt]
    handler = OpenAIGenerationHandler(
        url=url, model=ALIAS, api="chat", prompt_template=template, system_prompt=system,
        json_schema=SCHEMA, max_tokens=args.max_tokens, temperature=0.0, request_timeout_s=60.0,
        deadline_s=120.0, concurrency=LimiterConfig(initial=args.parallel, maximum=args.parallel))
    return ModelRuntime.acquire(handler, BatchingConfig(max_batch_size=args.batch))


def with_b(work: Path, tag: str, args: argparse.Namespace, prompt: str, warm: Sequence[Review],
           body: Any) -> Any:
    """``body(runtime_b)`` with B on a fresh llama-server, warmed on ``warm`` (dev records)."""
    with launch.llama_server(launch.smollm2_gguf(), ALIAS, work / f"llama-{tag}.log",
                             parallel=args.parallel) as url:
        runtime = b_runtime(url, args, prompt)
        try:
            runtime.submit_batch([r.text for r in warm]).result()
            return body(runtime)
        finally:
            runtime.release()


def tune_prompt(work: Path, args: argparse.Namespace, dev: list[Review], a: ModelRuntime,
                tasks: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The prompt of ``--prompts`` with the best accuracy of B alone on the dev sample."""
    if len(args.prompts) == 1:
        return args.prompts[0], {}
    scores: dict[str, Any] = {}
    for prompt in args.prompts:
        def run(b: ModelRuntime, prompt: str = prompt) -> dict[str, Any]:
            dispatch = Dispatch({"a": a, "b": b})
            tasks["b"] = b.handler.task()
            answers, wall = route_all(ModelNode("b"), dev, dispatch, args.batch)
            row = summarise(prompt, dev, answers, wall, dispatch, tasks)
            return {k: row[k] for k in ("accuracy", "dead_letters", "records_per_s")}

        scores[prompt] = with_b(work, f"dev-{prompt}", args, prompt, dev[:4], run)
        print(f"[{time.strftime('%X')}] dev, B with prompt {prompt}: {scores[prompt]}", flush=True)
    best = max(args.prompts, key=lambda p: (scores[p]["accuracy"], -scores[p]["dead_letters"]))
    return best, scores


def thresholds(a: ModelRuntime, dev: list[Review], task: Any, shares: Sequence[float]) -> dict[str, Any]:
    """A's margin on the dev sample and the margins below which ``shares`` of it fall."""
    outcomes = [o for o in a.submit_batch([r.text for r in dev]).result() if isinstance(o, Inferred)]
    if len(outcomes) != len(dev):
        raise SystemExit(f"A failed on {len(dev) - len(outcomes)} dev reviews")
    margins = np.array([confidence_of(task.probabilities(o.prediction), Confidence.MARGIN) for o in outcomes])
    picked = [round(float(np.quantile(margins, q)), 4) for q in shares]
    return {"shares": list(shares), "thresholds": picked,
            "dev_escalated": [float(np.mean(margins < t)) for t in picked],
            "dev_a_accuracy": float(np.mean([task.render(o.prediction)["label"] == LABELS[r.label]
                                             for o, r in zip(outcomes, dev, strict=True)]))}


def lexicon_model(work: Path, train: list[Review], dev: list[Review], test: list[Review]) -> dict[str, Any]:
    """The lexicon trained on ``train`` (the split's train part), saved under ``work``; its facts.

    Raises:
        SystemExit: A dev or test review (by id) is among the training reviews.
    """
    train_ids = {r.id for r in train}
    leaked = [r.id for r in [*dev, *test] if r.id in train_ids]
    if leaked:
        raise SystemExit(f"{len(leaked)} dev/test reviews are in the lexicon's training data: {leaked[:5]}")
    path = work / "lexicon.json"
    lexicon = lexicon_handler.train_lexicon(train, min_count=LEXICON_MIN_COUNT, alpha=LEXICON_ALPHA)
    texts = {r.text for r in train}
    return {"path": str(path), "sha256": lexicon.save(path), "train_reviews": len(train),
            "words": len(lexicon.weights), "min_count": LEXICON_MIN_COUNT, "alpha": LEXICON_ALPHA,
            "dev_test_ids_in_train": len(leaked),
            "test_texts_in_train": sum(r.text in texts for r in test),
            "dev_texts_in_train": sum(r.text in texts for r in dev)}


def with_lexicon(lexicon: dict[str, Any], args: argparse.Namespace, warm: Sequence[Review], body: Any) -> Any:
    """``body(runtime_b)`` with B = a fresh runtime of the lexicon handler, warmed on ``warm``."""
    handler = lexicon_handler.LexiconSentimentHandler(Path(lexicon["path"]), lexicon["sha256"])
    runtime = ModelRuntime.acquire(handler, BatchingConfig(max_batch_size=args.batch))
    try:
        runtime.submit_batch([r.text for r in warm]).result()
        return body(runtime)
    finally:
        runtime.release()


class Shared:
    """What every B's runs share: the samples, A's runtime and task, the thresholds."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.assets = ensure_model_assets()
        self.dev, self.test, self.split, self.train = samples(self.assets, args)
        self.a = ModelRuntime.acquire(SentimentHandler(self.assets),
                                      BatchingConfig(max_batch_size=args.batch))
        self.task_a = self.a.handler.task()
        self.a.submit_batch([r.text for r in self.dev]).result()  # warm-up (ORT's first runs)
        self.cuts = thresholds(self.a, self.dev, self.task_a, args.escalate)
        print(f"[{time.strftime('%X')}] thresholds from the dev sample: {self.cuts}", flush=True)


def run_group(b: str, work: Path, args: argparse.Namespace, shared: Shared) -> dict[str, Any]:
    """A alone, B alone and the cascade at each threshold, for the B named ``b``; its results."""
    started, where = time.perf_counter(), machine()
    print(f"[{time.strftime('%X')}] B = {b}: {where}", flush=True)
    tasks: dict[str, Any] = {"a": shared.task_a}
    info: dict[str, Any]
    if b == "smollm":
        prompt, tuning = tune_prompt(work, args, shared.dev, shared.a, tasks)

        def session(tag: str, warm: Sequence[Review], body: Any) -> Any:
            return with_b(work, tag, args, prompt, warm, body)

        info = {"prompt": prompt, "prompt_template": PROMPTS[prompt][1], "system_prompt": PROMPTS[prompt][0],
                "prompt_tuning": tuning, "max_tokens": args.max_tokens, "parallel": args.parallel,
                "schema": SCHEMA}
    else:
        lexicon = lexicon_model(work, shared.train, shared.dev, shared.test)
        print(f"[{time.strftime('%X')}] lexicon trained on the train split: {lexicon}", flush=True)

        def session(tag: str, warm: Sequence[Review], body: Any) -> Any:
            return with_lexicon(lexicon, args, warm, body)

        info = {"lexicon": {k: v for k, v in lexicon.items() if k != "path"}}
    one: dict[str, Any] = dict(args=args, test=shared.test, dev=shared.dev, a=shared.a, tasks=tasks,
                               session=session, b=b)
    plan: list[tuple[str, RouteNode, dict[str, Any]]] = [("A alone", ModelNode("a"), {}),
                                                         ("B alone", ModelNode("b"), {})]
    for share, t in zip(shared.cuts["shares"], shared.cuts["thresholds"], strict=True):
        node = CascadeNode(stages=(CascadeStage(model="a", task=shared.task_a, measure=Confidence.MARGIN,
                                                below=t),), last=ModelNode("b"))
        plan.append((f"cascade, margin < {t:g}", node, {"threshold": t, "dev_share": share}))
    rounds = 1 if b == "smollm" else max(1, args.rounds)
    runs: list[dict[str, Any]] = []
    for r in range(rounds):  # interleaved, so a slow spell of the machine falls on every run alike
        for i, (name, node, extra) in enumerate(plan):
            row = run_one(name=name, node=node, **extra, **one)
            if r == 0:
                runs.append({**row, "rounds_records_per_s": [row["records_per_s"]]})
            else:
                if row["correct"] != runs[i]["correct"]:
                    raise SystemExit(f"{name}: round {r + 1} answered differently from round 1")
                runs[i]["rounds_records_per_s"].append(row["records_per_s"])
    for row in runs:
        row["records_per_s"] = float(np.median(row["rounds_records_per_s"]))
        row["wall_s"] = row["records"] / row["records_per_s"]
    group = {"b": b, "model_sha256": shared.assets.sha256, "test": len(shared.test), "dev": len(shared.dev),
             "batch": args.batch, **info, "thresholds": shared.cuts, "runs": runs, "split": shared.split,
             "test_fresh_share": float(np.mean([r.label for r in shared.test])), "machine": where,
             "rounds": rounds, "run_s": time.perf_counter() - started}
    analyse(group)
    return group


def run_one(*, args: argparse.Namespace, name: str, node: RouteNode, test: list[Review], dev: list[Review],
            a: ModelRuntime, tasks: dict[str, Any], session: Any, b: str, **extra: Any) -> dict[str, Any]:
    """One run over the test sample (``session(tag, warm, body)`` runs ``body`` with B's runtime)."""
    def body(runtime_b: ModelRuntime | None) -> dict[str, Any]:
        runtimes = {"a": a} if runtime_b is None else {"a": a, "b": runtime_b}
        if runtime_b is not None:
            tasks["b"] = runtime_b.handler.task()
        dispatch = Dispatch(runtimes)
        answers, wall = route_all(node, test, dispatch, args.batch)
        return summarise(name, test, answers, wall, dispatch, tasks, **extra)

    tag = "".join(c if c.isalnum() or c == "." else "-" for c in name)
    row = body(None) if "b" not in node.models else session(tag, dev[:8], body)
    print(f"[{time.strftime('%X')}] B = {b}, {name}: accuracy {row['accuracy']:.3f}, escalated "
          f"{row['escalated']}, {row['records_per_s']:.1f} records/s, B share {row['b_share']:.0%}, "
          f"dead letters {row['dead_letters']}", flush=True)
    return row


def mcnemar(first: Sequence[bool], second: Sequence[bool]) -> dict[str, Any]:
    """McNemar's exact test (two-sided binomial on the discordant pairs) of two runs' correctness on
    the same records (McNemar, Psychometrika 12(2), 1947; exact form: Edwards 1948)."""
    pairs = list(zip(first, second, strict=True))
    only_first = sum(1 for x, y in pairs if x and not y)
    only_second = sum(1 for x, y in pairs if y and not x)
    n = only_first + only_second
    p = binomtest(only_second, n, 0.5).pvalue if n else 1.0
    return {"only_first_right": only_first, "only_second_right": only_second,
            "both_wrong": sum(1 for x, y in pairs if not x and not y), "p_value": float(p)}


def analyse(group: dict[str, Any]) -> None:
    """Per cascade: A's and B's accuracy (from their runs alone) on the records it escalated, the
    agreement of its answers with theirs, and McNemar against A alone and against B alone; B alone
    against A alone. Recomputed from the stored answers, so it may run again on a stored group."""
    a_run, b_run = group["runs"][0], group["runs"][1]
    group["b_vs_a"] = mcnemar(a_run["correct"], b_run["correct"])
    for run in group["runs"][2:]:
        up = set(run["escalated_rows"])
        kept = [i for i in range(run["records"]) if i not in up]
        run["a_accuracy_on_escalated"] = _mean([a_run["correct"][i] for i in up])
        run["b_accuracy_on_escalated"] = _mean([b_run["correct"][i] for i in up])
        run["test_escalated_share"] = len(up) / run["records"]
        run["same_as_a_alone_on_kept"] = _mean([run["labels"][i] == a_run["labels"][i] for i in kept])
        run["same_as_b_alone_on_escalated"] = _mean([run["labels"][i] == b_run["labels"][i] for i in up])
        run["vs_a"] = mcnemar(a_run["correct"], run["correct"])
        run["vs_b"] = mcnemar(b_run["correct"], run["correct"])


def _mean(values: Sequence[bool]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _groups(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The stored Bs' results, in :data:`BS` order."""
    return [data["bs"][b] for b in BS if b in data["bs"]]


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _groups(data)
    first = groups[0]
    fig, ax = plt.subplots(figsize=(8, 5))
    for k, g in enumerate(groups):
        name, colour = BS[g["b"]]
        a_run, b_run, cascades = g["runs"][0], g["runs"][1], g["runs"][2:]
        xs = [0] + [r["escalated"] for r in cascades] + [b_run["escalated"]]
        ys = [a_run["accuracy"]] + [r["accuracy"] for r in cascades] + [b_run["accuracy"]]
        ax.plot(xs, ys, color=colour, lw=0.8, ls=":", zorder=1)
        ax.plot([r["escalated"] for r in cascades], [r["accuracy"] for r in cascades], "o-", color=colour,
                label=f"cascade A → B = {name}", zorder=2)
        ax.plot([b_run["escalated"]], [b_run["accuracy"]], "D", ms=9, color=colour,
                label=f"B alone: {name} ({_rate(b_run['records_per_s'])})", zorder=3)
        above = k % 2 == 0
        for r in [*cascades, b_run]:
            ax.annotate(_rate(r["records_per_s"]), (r["escalated"], r["accuracy"]), color=colour,
                        textcoords="offset points", xytext=(6, 6 if above else -13), fontsize=8)
    a_rates = "; ".join(dict.fromkeys(_rate(g["runs"][0]["records_per_s"]) for g in groups))
    for k, g in enumerate(groups):
        ax.plot([0], [g["runs"][0]["accuracy"]], "s", ms=9, color="tab:green", zorder=4,
                label=f"A alone: MiniLM + head, ONNX Runtime ({a_rates})" if k == 0 else None)
    ax.axhline(max(first["test_fresh_share"], 1 - first["test_fresh_share"]), color="k", lw=0.6, ls="--",
               label="majority label")
    cascades = first["runs"][2:]
    ax.set_xticks([0, *(r["escalated"] for r in cascades), first["test"]],
                  ["0\nA alone", *(f"{r['escalated']}\n< {r['threshold']:.2g}" for r in cascades),
                   f"{first['test']}\nB alone"], fontsize=8)
    ax.set_xlabel(f"calls to B (records escalated, of {first['test']}); the cascade's threshold on A's "
                  "margin")
    ax.set_ylabel("accuracy on the test reviews")
    ax.set_title("A cascade on the reviews: accuracy against calls to the second model B (labels: records/s)",
                 fontsize=10)
    ax.margins(x=0.08, y=0.15)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _rate(records_per_s: float) -> str:
    return f"{records_per_s:.0f}/s" if records_per_s >= 100 else f"{records_per_s:.1f}/s"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def table(group: dict[str, Any]) -> list[str]:
    lines = ["| run | accuracy | records escalated (calls to B) | records/s (wall, B included) | "
             "B's share of the time | B dead letters | A / B accuracy on the escalated records | "
             "1-min load after |", "|---|---|---|---|---|---|---|---|"]
    for r in group["runs"]:
        on_up = (f"{_pct(r['a_accuracy_on_escalated'])} / {_pct(r['b_accuracy_on_escalated'])}"
                 if "a_accuracy_on_escalated" in r else "-")
        dead = "-" if r["escalated"] == 0 else str(r["dead_letters"])
        share = r["escalated"] / r["records"]
        lines.append(f"| {r['run']} | {r['accuracy']:.3f} | {r['escalated']} ({share:.0%}) | "
                     f"{r['records_per_s']:.1f} | {r['b_share']:.0%} | {dead} | {on_up} | "
                     f"{r['load_1min']:.1f} |")
    return lines


def _sig(p: float) -> str:
    return "significant at the 5 % level" if p < 0.05 else "not significant at the 5 % level"


def tests_line(group: dict[str, Any]) -> str:
    """McNemar's tests of the group: B alone against A alone, each cascade against A and B alone."""
    a_run, b_run, cascades = group["runs"][0], group["runs"][1], group["runs"][2:]
    m = group["b_vs_a"]
    a_wrong = m["only_second_right"] + m["both_wrong"]
    b_error = 1 - b_run["accuracy"]

    def against(alone: dict[str, Any], key: str) -> str:
        return ", ".join(f"{r['run'].split(', ')[1]}: {r['accuracy'] - alone['accuracy']:+.3f} "
                         f"(p = {r[key]['p_value']:.2g})" for r in cascades)

    return (f"B alone against A alone (McNemar, exact): A right where B is wrong on "
            f"{m['only_first_right']} reviews, B right where A is wrong on {m['only_second_right']}, both "
            f"wrong on {m['both_wrong']}; p = {m['p_value']:.2g}. B is wrong on "
            f"{m['both_wrong'] / a_wrong:.0%} of the {a_wrong} reviews A gets wrong, against {b_error:.0%} "
            "of all of them (B's errors independent of A's would give the latter). Each cascade against A "
            f"alone: {against(a_run, 'vs_a')}; against B alone: {against(b_run, 'vs_b')}.")


def verdict(group: dict[str, Any]) -> list[str]:
    a_run, b_run, cascades = group["runs"][0], group["runs"][1], group["runs"][2:]
    a_acc, b_acc, a_rate, b_rate = (a_run["accuracy"], b_run["accuracy"], a_run["records_per_s"],
                                    b_run["records_per_s"])
    m = group["b_vs_a"]
    significant = ", significantly" if m["p_value"] < 0.05 else ", not significantly"
    majority = max(group["test_fresh_share"], 1 - group["test_fresh_share"])
    best = max(cascades, key=lambda r: (r["accuracy"], -r["escalated"]))
    gain, p_a, p_b = best["accuracy"] - a_acc, best["vs_a"]["p_value"], best["vs_b"]["p_value"]
    if b_acc < a_acc:
        b_fresh = float(np.mean([lab == "fresh" for lab in b_run["labels"] if lab is not None]))
        why = (" On this machine the only generation model is SmolLM2-135M, far weaker than a head trained "
               f"on these reviews: it answered `fresh` to {b_fresh:.0%} of the reviews it labelled "
               f"({group['test_fresh_share']:.0%} are fresh)." if group["b"] == "smollm" else "")
        return [f"**B alone is worse than A alone**: {b_acc:.3f} against {a_acc:.3f}{significant} "
                f"(majority label {majority:.3f}).{why} A cascade can only gain where B beats A on the "
                "records A is unsure of (the last column). The best cascade reached "
                f"{best['accuracy']:.3f} ({best['run']}, p = {p_a:.2g} against A) against A's {a_acc:.3f}, "
                f"at {best['records_per_s']:.1f} records/s against A's {a_rate:.0f}."
                + (" This run measures the route's mechanics and costs (escalation shares that follow the "
                   "dev thresholds, throughput set by the calls to B) more than a gain: a real deployment "
                   "puts a stronger model behind the same OpenAI-compatible endpoint, with the same route "
                   "and the same way of picking thresholds, and should first check, as the last column does, "
                   "that B beats A where A is unsure." if group["b"] == "smollm" else "")]
    d_b = b_acc - a_acc
    wins = sum(1 for r in cascades
               if (r["b_accuracy_on_escalated"] or 0) > (r["a_accuracy_on_escalated"] or 0))
    text = [f"**B alone is {'more accurate than' if d_b > 0 else 'as accurate as'} A alone**: "
            f"{b_acc:.3f} against {a_acc:.3f} ({d_b:+.3f}, p = {m['p_value']:.2g}, {_sig(m['p_value'])}), "
            f"at {b_rate:.0f} records/s against A's {a_rate:.1f}. On the records A is unsure of, B is right "
            f"more often than A at {wins} of the {len(cascades)} thresholds (the last column). The best "
            f"cascade, `margin < {best['threshold']:g}` ({best['escalated']} records, "
            f"{best['test_escalated_share']:.0%}, escalated), reached {best['accuracy']:.3f}: {gain:+.3f} "
            f"against A alone (p = {p_a:.2g}, {_sig(p_a)}; {min(1.0, p_a * len(cascades)):.2g} with "
            f"Bonferroni's correction, as it is the best of {len(cascades)} on the same test reviews) and "
            f"{best['accuracy'] - b_acc:+.3f} against B alone (p = {p_b:.2g}), at "
            f"{best['records_per_s']:.1f} records/s ({best['records_per_s'] / a_rate:.0%} of A alone's, B's "
            f"share of the time {best['b_share']:.0%})."]
    if p_a < 0.05:
        text.append(f"So the cascade beats A alone, significantly, by {gain:.3f} "
                    f"({round(gain * best['records'])} more of the {best['records']} reviews right).")
    else:
        disagree = best["vs_a"]["only_first_right"] + best["vs_a"]["only_second_right"]
        text.append(f"So the cascade is {gain:+.3f} against A alone, which {best['records']} test reviews "
                    f"cannot tell from chance (McNemar counts only the {disagree} reviews on which the two "
                    "disagree).")
    if b_acc >= best["accuracy"]:
        text.append("B alone is at least as accurate as every cascade here"
                    + (" and faster than A alone: with this pair, the deployment to pick is B alone, not a "
                       "cascade that asks A first." if b_rate >= a_rate else f", at {b_rate:.1f} records/s."))
    return [" ".join(text)]


def _b_description(group: dict[str, Any]) -> list[str]:
    """What B was, in the group's words."""
    if group["b"] == "smollm":
        tuned = ("" if not group["prompt_tuning"] else " Chosen on the dev sample among " + ", ".join(
            f"`{k}` ({v['accuracy']:.3f})" for k, v in group["prompt_tuning"].items()) + ".")
        return [f"**B**: SmolLM2-135M-Instruct (Q4_1) on llama.cpp's `llama-server` ({group['parallel']} "
                "slots, greedy), through `OpenAIGenerationHandler` (chat) with a JSON schema whose `label` "
                "is an enum of fresh / rotten; a record B dead-letters counts as wrong. Its prompt "
                f"(`{group['prompt']}`): system {json.dumps(group['system_prompt'])}, user "
                f"{json.dumps(group['prompt_template'])}, at most {group['max_tokens']} tokens.{tuned}"]
    lex = group["lexicon"]
    return [f"**B**: the word lexicon of `jobs/examples/lexicon_handler.py` (binarised naive Bayes log-count "
            "ratios, Wang & Manning 2012; `LexiconSentimentHandler` behind a `ModelRuntime`, in process), "
            f"trained in the run on the {lex['train_reviews']:,} **train** reviews of the split A's head was "
            f"trained on ({lex['words']:,} words seen in at least {lex['min_count']} of them; version "
            f"`{lex['sha256'][:12]}`). No dev or test review is among them (checked by id: "
            f"{lex['dev_test_ids_in_train']} found); {lex['test_texts_in_train']} of the {group['test']} "
            "test reviews' texts also occur verbatim among the training texts (duplicates in the dataset, "
            "seen by A's head as well). A different kind of model from A (word counts, no embedding)."]


def _group_section(group: dict[str, Any]) -> list[str]:
    checks = ", ".join(f"{r['same_as_a_alone_on_kept']:.1%} / {_pct(r['same_as_b_alone_on_escalated'])}"
                       for r in group["runs"][2:])
    fresh = (" Each run that calls B has a fresh server (warmed on dev reviews), so no run is served from "
             "another's prompt cache." if group["b"] == "smollm" else
             " Each run that calls B has a fresh runtime (warmed on dev reviews).")
    again = (" (B's greedy answers may differ now and then between runs: llama.cpp decodes concurrent "
             "conversations in one batch)" if group["b"] == "smollm" else "")
    return [f"### B: {BS[group['b']][0]}", "",
            *_b_description(group), "",
            f"Machine: {group['machine']}", "",
            *table(group), "",
            "The last column: A's and B's accuracy (from their runs alone) on the records that threshold "
            f"escalated; a cascade gains where B's is the higher.{fresh} Checks: the cascades' answers equal "
            f"A alone's on the records they kept / B alone's on those they escalated: {checks}{again}.", "",
            tests_line(group), "",
            *verdict(group), "",
            f"Run time {group['run_s'] / 60:.1f} min.{_rounds_note(group)}{_load_note(group)}", ""]


def _rounds_note(group: dict[str, Any]) -> str:
    """How records/s was taken: one run, or the median of interleaved rounds (with their spread)."""
    rounds = group.get("rounds", 1)
    if rounds <= 1:
        return " Records/s: one run each."
    spread = ", ".join(f"{r['run']} {min(r['rounds_records_per_s']):.0f}-{max(r['rounds_records_per_s']):.0f}"
                       for r in group["runs"])
    return (f" Records/s: the median of {rounds} interleaved rounds over all runs (every round answered "
            f"alike; B's share and the load from the first), range per run: {spread}.")


def section(data: dict[str, Any]) -> str:
    groups = _groups(data)
    first = groups[0]
    cuts = first["thresholds"]
    shares = ", ".join(f"{s:.0%} → margin < {t:g}"
                       for s, t in zip(cuts["shares"], cuts["thresholds"], strict=True))
    names = " and ".join(BS[g["b"]][0] for g in groups)
    several = len(groups) > 1
    return "\n".join([
        SECTION, "",
        f"`bench/cascade_bench.py` (issue 26): {first['test']} test reviews from the sentiment model's "
        f"held-out split ({first['test_fresh_share']:.0%} fresh), in batches of {first['batch']} through "
        "`run_route`. **A**: the sentiment model (MiniLM + logistic head, ONNX Runtime, in process). "
        f"**B**: {names}" + (", each measured in a run of its own (A alone, B alone, the cascades)" if several
                             else "") + ". "
        "The cascade: `CascadeNode(stages=(CascadeStage(model=\"a\", measure=Confidence.MARGIN, below=t),), "
        "last=ModelNode(\"b\"))`; the thresholds are quantiles of A's margin on a separate dev sample of "
        f"{first['dev']} held-out reviews ({shares})" + (", the same for every B, so every B gets the same "
                                                          "records escalated" if several else "") + ".", "",
        *(line for g in groups for line in _group_section(g)),
        f"Raw numbers: `{RESULTS}`. The plot: accuracy against calls to B, A alone and each B alone as "
        "points, each B's cascades as a line.", "",
        f"![accuracy against calls to B]({PNG})", "", ""])


def _load_note(group: dict[str, Any]) -> str:
    """A sentence when other work ran on the machine (1-min load above 1 after a run), else ''."""
    if max(r["load_1min"] for r in group["runs"]) <= 1.0:
        return ""
    return (" Other work shared the machine during the run (the load column): records/s and B's share "
            "carry that noise; accuracies and escalations do not depend on it"
            + (" (greedy decoding)." if group["b"] == "smollm" else "."))


def load_results(path: Path) -> dict[str, Any]:
    """The stored results as ``{"bs": {b: group}}`` (a file of the first format, one flat dict, held
    SmolLM's results only)."""
    if not path.exists():
        return {"bs": {}}
    data = json.loads(path.read_text())
    if "bs" not in data:
        data = {"bs": {"smollm": {**data, "b": "smollm"}}}
    return data


def merge(stored: dict[str, Any], new: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The new groups, and the stored groups of other Bs measured on the same samples and thresholds."""
    ref = next(iter(new.values()))
    bs: dict[str, Any] = {}
    for b in BS:
        if b in new:
            bs[b] = new[b]
        elif b in stored["bs"]:
            old = stored["bs"][b]
            differ = [k for k in SAME if old.get(k) != ref[k]]
            if old["thresholds"]["thresholds"] != ref["thresholds"]["thresholds"]:
                differ.append("thresholds")
            if differ:
                print(f"WARNING: dropping the stored results of B = {b}: its {', '.join(differ)} differ from "
                      "this run's; run it again with this run's settings", flush=True)
                continue
            analyse(old)
            bs[b] = old
    return {"bs": bs}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out_dir / RESULTS
    stored = load_results(out)
    if args.report_only:
        if not stored["bs"]:
            raise SystemExit(f"{out}: no results")
        data = stored
        for group in _groups(data):
            analyse(group)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the llama-server on the way out
        started = time.perf_counter()
        new: dict[str, dict[str, Any]] = {}
        with tempfile.TemporaryDirectory(prefix="aisp-cascade-") as tmp:
            shared = Shared(args)
            try:
                for b in args.b:
                    new[b] = run_group(b, Path(tmp), args, shared)
            finally:
                shared.a.release()
        print(f"[{time.strftime('%X')}] wall {(time.perf_counter() - started) / 60:.1f} min", flush=True)
        data = merge(stored, new)
        args.out_dir.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1) + "\n")
    plot(data, args.out_dir / PNG)
    replace_section(args.out_dir / "REPORT.md", SECTION, section(data))
    for group in _groups(data):
        print(f"B = {group['b']}", *table(group), tests_line(group), *verdict(group), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
