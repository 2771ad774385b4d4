"""bench/_kafka_streaming.steady_rate and bench/_cpu.jit_share: the steady phase of a job run, after
the JVMs' JIT compilers are done, and the cores those compilers took (issue 24)."""

from __future__ import annotations

from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def streaming(bench_module) -> ModuleType:
    return bench_module("_kafka_streaming")


@pytest.fixture(scope="module")
def cpu(bench_module) -> ModuleType:
    return bench_module("_cpu")


def test_the_steady_rate_counts_the_outputs_from_the_cut_to_the_last(streaming) -> None:
    started = 1_000_000.0
    # 100 records/s for the first 60 s (JIT busy), then 200/s for 90 s
    slow = [started + 5_000 + 10.0 * i for i in range(5_500)]
    fast = [started + 60_000 + 5.0 * (i + 1) for i in range(18_000)]
    assert streaming.steady_rate(slow + fast, started, 60.0) == pytest.approx(200.0)
    # a run shorter than twice the cut has no steady phase to speak of
    assert streaming.steady_rate(slow + fast[:1000], started, 60.0) == 0.0
    assert streaming.steady_rate([], started, 60.0) == 0.0


def test_jit_share_sums_the_compiler_threads_per_jvm_role(cpu) -> None:
    seconds = {("Flink JVM", "C2 CompilerThre"): 9.0, ("Flink JVM", "C1 CompilerThre"): 1.0,
               ("Flink JVM", "Source: KafkaSource"): 50.0, ("broker JVM", "C2 CompilerThre"): 3.0,
               ("job client + Python worker", "python"): 80.0}
    assert cpu.jit_share(seconds, 50.0) == {"Flink JVM": pytest.approx(0.2),
                                            "broker JVM": pytest.approx(0.06)}
    assert cpu.jit_share(seconds, 0.0) == {}


def test_this_process_threads_are_seen_by_role_and_name(cpu) -> None:
    snapshot = cpu.cpu_snapshot()
    assert any(role == "bench" for role, _ in snapshot)  # this process, under its role
    assert all(seconds >= 0.0 for seconds in snapshot.values())
