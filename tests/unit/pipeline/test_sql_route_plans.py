"""Several models in one SQL query, planned and run by PyFlink (an in-process TableEnvironment in
BATCH mode, functions registered by name from a registry): which rows each model scores.

* ``CASE WHEN kind = 'x' THEN fa(text) ELSE fb(text) END`` over two registered model functions
  calls BOTH for every row (Flink computes the CASE's operands in the Python operator, then picks
  one): the pitfall docs/sql.md warns of. These tests fail if Flink ever stops doing it;
* the registry's route function scores each row once, with its route's model;
* the ``UNION ALL`` rewrite filters before each function: each row once (a NULL ``kind`` passes
  neither ``kind = 'x'`` nor ``kind <> 'x'``: ``IS DISTINCT FROM`` keeps it).

Each handler writes one line per text it scores into a log (the Python workers are other
processes), which the tests count.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

#: One line per text scored: "<name>\t<text>"; the model: P(pos) = the text's share of vowels.
HANDLER = '''
from pyflink_aisp.inference import ModelHandler
from pyflink_aisp.inference.tasks import ClassificationTask


def vowels(text):
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.5


class LoggedHandler(ModelHandler):
    def __init__(self, log, name):
        self.log, self.name = log, name

    def load_model(self):
        return None

    def model_version(self):
        return self.name * 64

    def run_inference(self, batch, model):
        with open(self.log, "a", encoding="utf-8") as f:
            f.writelines(f"{self.name}\\t{t}\\n" for t in batch)
        return [[1 - vowels(t), vowels(t)] for t in batch]

    def task(self, *, with_embedding=False):
        return ClassificationTask(labels=("neg", "pos"))
'''

ROWS = [("x", "a banana"), ("y", "rhythm"), ("x", "queue"), ("y", "dry sky"), (None, "hello")]
TEXTS = [t for _, t in ROWS]
X = [t for k, t in ROWS if k == "x"]
NOT_X = [t for k, t in ROWS if k != "x"]  # the NULL kind too: CASE's ELSE and the route's default take it


def _vowels(text: str) -> float:
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters)


@pytest.fixture(scope="module")
def t_env(tmp_path_factory):
    from pyflink.table import DataTypes, EnvironmentSettings, TableEnvironment

    folder = tmp_path_factory.mktemp("route-plans")
    (folder / "logged_handler.py").write_text(HANDLER)
    log = folder / "calls.log"
    (folder / "models.yaml").write_text(f"""
models:
  fa: {{task: handler, class: "logged_handler:LoggedHandler", args: {{log: "{log}", name: a}}}}
  fb: {{task: handler, class: "logged_handler:LoggedHandler", args: {{log: "{log}", name: b}}}}
routes:
  by_kind:
    rules:
      - {{when: {{field: /kind, equals: x}}, to: fa}}
    default: fb
""")
    patch = pytest.MonkeyPatch()
    patch.setenv("AISP_MODELS", str(folder / "models.yaml"))  # read where the functions are resolved
    patch.syspath_prepend(str(folder))  # the handler's module, on the client (python.files: the workers)
    env = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
    config = env.get_config()
    for key, value in [("python.executable", sys.executable), ("python.client.executable", sys.executable),
                       ("parallelism.default", "1"), ("python.files", str(folder / "logged_handler.py"))]:
        config.set(key, value)
    for name, target in [("fa", "fa"), ("fb", "fb"), ("fa_pandas", "fa_pandas"), ("fb_pandas", "fb_pandas"),
                         ("by_kind", "by_kind")]:
        env.execute_sql(f"CREATE TEMPORARY SYSTEM FUNCTION {name} AS "
                        f"'pyflink_aisp.pipeline.registry.{target}' LANGUAGE PYTHON")
    schema = DataTypes.ROW([DataTypes.FIELD("kind", DataTypes.STRING()),
                            DataTypes.FIELD("body", DataTypes.STRING())])
    env.create_temporary_view("reviews", env.from_elements(ROWS, schema))
    env.log = log
    yield env
    patch.undo()


def _plan(t_env, query: str) -> list[str]:
    """The optimized execution plan's lines."""
    return t_env.explain_sql(query).split("== Optimized Execution Plan ==")[1].strip().splitlines()


def _run(t_env, query: str) -> tuple[list[tuple], dict[str, list[str]]]:
    """The query's rows, and the texts each model scored (sorted)."""
    t_env.log.unlink(missing_ok=True)
    with t_env.execute_sql(query).collect() as results:
        rows = [tuple(r) for r in results]
    lines = t_env.log.read_text(encoding="utf-8").splitlines() if t_env.log.exists() else []
    calls: dict[str, list[str]] = {"a": [], "b": []}
    for line in lines:
        name, text = line.split("\t")
        calls[name].append(text)
    return rows, {k: sorted(v) for k, v in calls.items()}


def _python_operators(plan: list[str]) -> list[str]:
    return [line.strip(" :+-") for line in plan if re.search(r"Python\w*Calc\(", line)]


def _score(text: str) -> float:
    return max(_vowels(text), 1 - _vowels(text))


CASE = ("SELECT kind, body, CASE WHEN kind = 'x' THEN {a}(body).score ELSE {b}(body).score END AS score "
        "FROM reviews")
ROUTE = ("SELECT kind, body, r.score, r.model_sha256 FROM (SELECT kind, body, by_kind(body, kind) AS r "
         "FROM reviews)")


def test_case_over_two_pandas_functions_plans_one_python_calc_that_calls_both_for_every_row(t_env):
    query = CASE.format(a="fa_pandas", b="fb_pandas")
    plan = _plan(t_env, query)
    assert _python_operators(plan) == [
        "PythonCalc(select=[kind, body, fa_pandas(body) AS f0, fb_pandas(body) AS f1])"]
    assert "CASE((kind = 'x'), f0.score, f1.score)" in plan[0]  # picked after both ran
    assert not any("where=" in line for line in plan)
    rows, calls = _run(t_env, query)
    assert calls == {"a": sorted(TEXTS), "b": sorted(TEXTS)}  # every row scored twice
    assert {t: (k, s) for k, t, s in rows} == {t: (k, pytest.approx(_score(t))) for k, t in ROWS}


def test_case_over_two_async_functions_plans_two_async_calcs_that_call_both_for_every_row(t_env):
    query = CASE.format(a="fa", b="fb")
    plan = _plan(t_env, query)
    assert _python_operators(plan) == ["PythonAsyncCalc(select=[kind, body, f0, fb(body) AS f1])",
                                       "PythonAsyncCalc(select=[kind, body, fa(body) AS f0])"]
    assert not any("where=" in line for line in plan)
    _, calls = _run(t_env, query)
    assert calls == {"a": sorted(TEXTS), "b": sorted(TEXTS)}


def test_the_route_function_plans_one_python_call_per_row_and_scores_each_row_once(t_env):
    query = ROUTE
    plan = _plan(t_env, query)
    assert _python_operators(plan) == ["PythonCalc(select=[kind, body, by_kind(body, kind) AS f0])"]
    rows, calls = _run(t_env, query)
    assert calls == {"a": sorted(X), "b": sorted(NOT_X)}
    assert {t: (k, s, v) for k, t, s, v in rows} == {
        t: (k, pytest.approx(_score(t)), ("a" if k == "x" else "b") * 64) for k, t in ROWS}


UNION = ("SELECT kind, body, fa_pandas(body).score AS score FROM reviews WHERE kind = 'x' UNION ALL "
         "SELECT kind, body, fb_pandas(body).score AS score FROM reviews WHERE {other}")


def test_the_union_all_rewrite_plans_each_function_after_its_own_filter(t_env):
    query = UNION.format(other="kind <> 'x'")
    plan = _plan(t_env, query)
    first, second = (i for i, line in enumerate(plan) if "PythonCalc(" in line)
    assert "fa_pandas(body)" in plan[first] and "where=[(kind = 'x')]" in plan[first + 1]
    assert "fb_pandas(body)" in plan[second] and "where=[(kind <> 'x')]" in plan[second + 1]
    rows, calls = _run(t_env, query)
    nulls = [t for k, t in ROWS if k is None]
    assert calls == {"a": sorted(X), "b": sorted(set(NOT_X) - set(nulls))}
    assert sorted(t for _, t, _ in rows) == sorted(set(TEXTS) - set(nulls))  # the NULL kind: in neither
    query = UNION.format(other="kind IS DISTINCT FROM 'x'")
    rows, calls = _run(t_env, query)
    assert calls == {"a": sorted(X), "b": sorted(NOT_X)}
    assert sorted(t for _, t, _ in rows) == sorted(TEXTS)


def test_the_plans_in_the_docs_are_the_measured_ones(t_env):
    """docs/sql.md shows these plans; each plan line must be there as Flink prints it."""
    page = _numbered((Path(__file__).resolve().parents[3] / "docs" / "sql.md").read_text(encoding="utf-8"))
    for query in (CASE.format(a="fa_pandas", b="fb_pandas"), CASE.format(a="fa", b="fb"),
                  ROUTE, UNION.format(other="kind <> 'x'")):
        for line in _plan(t_env, query):
            assert _numbered(line) in page, line


def _numbered(text: str) -> str:
    """``text`` with the anonymous source's number (``$1``; it counts the session's tables) as ``$1``."""
    return re.sub(r"(anonymous_python-input-format)\$\d+", r"\1$1", text)
