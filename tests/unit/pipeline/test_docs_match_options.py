"""The SQL job's SET block and the job's --help are what the code says (the options page: tests/unit/docs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pyflink_aisp.pipeline import InferenceOptions, flink_settings

ROOT = Path(__file__).resolve().parents[3]


def test_sql_job_sets_what_flink_settings_derives_from_its_job_parameters():
    sql = (ROOT / "jobs" / "sql" / "review_sentiment.sql").read_text(encoding="utf-8")
    sets = dict(re.findall(r"^SET '([^']+)' = '(.*)';$", sql, re.M))
    params = json.loads(sets.pop("pipeline.global-job-parameters"))
    options = InferenceOptions.from_job_parameters(lambda key, default: params.get(key, default))
    derived = flink_settings(options)
    assert {k: v for k, v in sets.items() if k in derived} == derived
    assert set(derived) <= set(sets)
    assert 'pyflink_aisp.pipeline.sql.sentiment' in sql


def test_job_help_lists_every_flag_with_its_default():
    import argparse

    from pyflink_aisp.pipeline import OPTIONS
    from pyflink_aisp.pipeline._config import add_flags

    parser = argparse.ArgumentParser()
    add_flags(parser)
    text = " ".join(parser.format_help().split())
    for opt in OPTIONS:
        assert opt.flag in text
        assert f"default {opt.render_default()}]" in text, opt.flag

