"""bench/_kafka_streaming.steady_rate and bench/_cpu.jit_share: the steady phase of a job run, after
the JVMs' JIT compilers are done, and the cores those compilers took (issue 24)."""

from __future__ import annotations

import os
import time
from types import ModuleType

import psutil
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


def test_the_sampler_s_own_cpu_moves_from_the_bench_role_to_its_own(cpu) -> None:
    snapshot = {("bench", "python"): 5.0, ("bench", "grpc"): 1.0, ("Flink JVM", "C2 CompilerThre"): 2.0}
    split = cpu.split_sampler(snapshot, "python", 1.5)
    assert split == {("bench", "python"): 3.5, ("bench", "grpc"): 1.0, ("Flink JVM", "C2 CompilerThre"): 2.0,
                     (cpu.SAMPLER_ROLE, "sampler"): 1.5}
    assert sum(split.values()) == pytest.approx(sum(snapshot.values()))  # moved, not added
    assert snapshot[("bench", "python")] == 5.0  # the input stays as it was
    # /proc's tick granularity can put the thread's group below what thread_time says: never negative
    assert cpu.split_sampler({("bench", "python"): 0.01}, "python", 0.02) == {
        ("bench", "python"): 0.0, (cpu.SAMPLER_ROLE, "sampler"): 0.01}


def test_a_running_sampler_reports_its_own_cpu_and_the_bench_s_work(cpu) -> None:
    with cpu.Sampler(period_s=0.05) as sampler:
        while not sampler.samples:  # the first snapshot before the work
            time.sleep(0.01)
        deadline = time.thread_time() + 0.3
        while time.thread_time() < deadline:  # the bench's main thread works meanwhile
            pass
        done = time.time()
        while sampler.samples[-1][0] <= done:  # a snapshot after the work, so the window holds all of it
            time.sleep(0.01)
    first, last = sampler.samples[0], sampler.samples[-1]
    wall, seconds = sampler.between(first[0], last[0])
    assert wall > 0.0
    assert last[1][(cpu.SAMPLER_ROLE, "sampler")] > 0.0  # each snapshot reads /proc: measured, not zero
    assert sum(v for (role, _), v in seconds.items() if role == "bench") >= 0.25  # the busy loop


def test_a_snapshot_reads_each_process_role_once_with_caches(cpu) -> None:
    roles: dict = {}
    names: dict = {}
    first = cpu.cpu_snapshot(roles, names)
    assert (os.getpid(), psutil.Process().create_time()) in roles
    assert roles[(os.getpid(), psutil.Process().create_time())] == "bench"
    cached = dict(roles)
    second = cpu.cpu_snapshot(roles, names)
    assert {k: v for k, v in roles.items() if k in cached} == cached
    assert set(first) & set(second)  # the same (role, thread) keys, summed again
