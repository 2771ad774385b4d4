"""The README's options table and the SQL job's SET block are what the code says."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pyflink_aisp.pipeline import PipelineOptions, flink_settings
from pyflink_aisp.pipeline._options import options_markdown

ROOT = Path(__file__).resolve().parents[3]


def test_readme_holds_the_generated_options_table():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- options-table:[^>]*-->\n(.*?)\n<!-- /options-table -->", readme, re.S)
    assert block is not None, "README has no options-table block"
    assert block.group(1) == options_markdown()


def test_sql_job_sets_what_flink_settings_derives_from_its_job_parameters():
    sql = (ROOT / "jobs" / "sql" / "review_sentiment.sql").read_text(encoding="utf-8")
    sets = dict(re.findall(r"^SET '([^']+)' = '(.*)';$", sql, re.M))
    params = json.loads(sets.pop("pipeline.global-job-parameters"))
    options = PipelineOptions.from_job_parameters(lambda key, default: params.get(key, default))
    derived = flink_settings(options)
    assert {k: v for k, v in sets.items() if k in derived} == derived
    assert set(derived) <= set(sets)
    assert 'pyflink_aisp.pipeline.sql.sentiment' in sql


def test_job_help_lists_every_flag_with_its_default():
    import argparse

    from pyflink_aisp.pipeline._config import add_flags
    from pyflink_aisp.pipeline._options import OPTIONS

    parser = argparse.ArgumentParser()
    add_flags(parser)
    text = " ".join(parser.format_help().split())
    for opt in OPTIONS:
        assert opt.flag in text
        assert f"default {opt.render_default()}]" in text, opt.flag


def test_readme_dead_letter_table_lists_every_reason_once():
    from pyflink_aisp.outcome import Reason

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Dead letters"):readme.index("## Options")]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", section, re.M)
    assert sorted(rows) == sorted(r.value for r in Reason)
