"""``--jvm-jit``: the JVM a local run starts (PyFlink's gateway, the MiniCluster's) gets the flags."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

_PROBE = """
import json, os, sys
from pyflink_aisp.pipeline import PipelineOptions
from pyflink_aisp.pipeline._settings import start_gateway
from pyflink.java_gateway import get_gateway

start_gateway(PipelineOptions.from_args(["--input-topic", "i", "--output-topic", "o", *sys.argv[1:]]))
jvm = get_gateway().jvm
args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
print(json.dumps({"args": args, "JVM_ARGS": os.environ.get("JVM_ARGS")}))
"""


_SHELL = ("PATH", "HOME", "JAVA_HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "USER")


def _probe(*flags: str, jvm_args: str | None = None) -> dict:
    # a fresh process, as `python jobs/...` from a shell is: not the state that jobs run earlier in this
    # process left in its environment (PyFlink's loopback workers copy theirs in: PYFLINK_GATEWAY_DISABLED,
    # python paths, an empty JAVA_HOME that makes PyFlink look for `bin/java`)
    env = {k: v for k, v in os.environ.items() if k in _SHELL and v}
    if jvm_args is not None:
        env["JVM_ARGS"] = jvm_args
    done = subprocess.run([sys.executable, "-c", _PROBE, *flags], capture_output=True, text=True, env=env,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_latency_target_starts_the_local_jvm_with_c1_only_and_leaves_jvm_args_as_they_were():
    seen = _probe("--latency-slo-ms", "100", jvm_args="-Xss2m")
    assert "-XX:TieredStopAtLevel=1" in seen["args"] and "-Xss2m" in seen["args"]
    assert seen["JVM_ARGS"] == "-Xss2m"  # the job's later subprocesses do not inherit the flag


def test_without_a_latency_target_the_local_jvm_keeps_hotspots_tiered_default():
    seen = _probe()
    assert not any(a.startswith("-XX:TieredStopAtLevel") for a in seen["args"])
    assert seen["JVM_ARGS"] is None
