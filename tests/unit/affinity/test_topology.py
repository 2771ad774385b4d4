"""Topology files and host NUMA discovery (issue 12.1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyflink_aisp import affinity
from pyflink_aisp.affinity import host_numa_nodes, load_topology, parse_cpulist, topology_from_dict
from pyflink_aisp.affinity._cli import format_topology
from pyflink_aisp.cli import main
from pyflink_aisp.errors import TopologyError

DATA = Path(__file__).resolve().parents[2] / "data" / "affinity"


def test_the_public_api_is_what_all_names() -> None:
    public = {n for n in vars(affinity) if not n.startswith("_") and not _is_module(n)} - {
        "annotations",
        "Any",
        "TYPE_CHECKING",
    }
    assert public <= set(affinity.__all__)
    assert all(getattr(affinity, n) is not None for n in affinity.__all__)  # the client ones load lazily


def test_the_core_imports_without_web_or_flink_packages() -> None:
    """The GPU host of bench/gpu_affinity_check.py has none of these."""
    import subprocess
    import sys

    code = (
        "import sys; import pyflink_aisp.affinity as a; a.LeaseStore; a.place; a.apply_lease; "
        "print(sorted(m for m in ('httpx', 'tenacity', 'pydantic', 'fastapi', 'uvicorn', 'pyflink', "
        "'psutil', 'yaml', 'prometheus_client') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert done.stdout.strip() == "[]"


def _is_module(name: str) -> bool:
    import types

    return isinstance(getattr(affinity, name), types.ModuleType)


def test_the_files_load_and_round_trip_through_the_printed_json(tmp_path: Path, capsys) -> None:
    for name in ("numa2x4.yaml", "mig.json", "full_gpu.yaml"):
        topology = load_topology(DATA / name)
        assert main(["affinity", "topology", "--topology", str(DATA / name), "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        (tmp_path / "again.json").write_text(json.dumps(printed))
        again = load_topology(tmp_path / "again.json")
        assert again.gpus == topology.gpus and again.numa_nodes == topology.numa_nodes


def test_the_text_view_names_each_gpu_and_mig_instance() -> None:
    lines = format_topology(load_topology(DATA / "mig.json"))
    assert lines[0] == "host gpu-host-mig (source " + str(DATA / "mig.json") + "): 2 GPU(s), 1 NUMA node(s)"
    assert lines[2].startswith(
        "  gpu 0 GPU-00000000-aaaa-bbbb-cccc-000000000000 NVIDIA H100 80GB HBM3: "
        "80.0 GiB free of 80.0 GiB, util 0%, pci 00000000:18:00.0 gen5 x16 (63.0 GB/s)"
    )
    assert lines[2].endswith("numa 0, cpus 0-7, mig on")
    assert lines[5] == "    mig 2 MIG-33333333-0000-0000-0000-000000000000: 40.0 GiB"


def _doc(**gpu_changes) -> dict:
    doc = json.loads((DATA / "mig.json").read_text())
    doc["gpus"][1].update(gpu_changes)
    return doc


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"pcie_max_width": 3},
            "gpu 1 (GPU-00000001-aaaa-bbbb-cccc-000000000001): pcie_max_gen must be 1..7 and "
            "pcie_max_width one of 1, 2, 4, 8, 16, 32, got 5 x3",
        ),
        ({"memory_free_bytes": -1}, "memory_total_bytes must be > 0 and 0 <= memory_free_bytes <= it"),
        ({"numa_node": 3}, "gpu 1: numa_node 3 is not among numa_nodes [0]"),
        (
            {"mig_instances": [{"uuid": "MIG-x", "index": 0, "memory_total_bytes": 1}]},
            "mig_instances given but mig_enabled is false",
        ),
        ({"cpu_affinity": [99]}, "gpu 1: cpu_affinity has CPUs the host lacks: [99]"),
        ({"pcie_gen": 5}, "gpus.1.pcie_gen: Unexpected keyword argument"),
        ({"index": "one"}, "gpus.1.index: Input should be a valid integer"),
        (
            {"uuid": "MIG-11111111-0000-0000-0000-000000000000"},
            "uuids (MIG instances included) and indices must",
        ),
    ],
)
def test_invalid_files_fail_in_one_line_naming_the_field(tmp_path: Path, change, message) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_doc(**change)))
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith(str(path))


def test_unreadable_and_non_mapping_files(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("gpus: [unclosed")
    with pytest.raises(TopologyError, match=r"cannot read topology file .*bad\.yaml"):
        load_topology(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(TopologyError, match="expected a mapping with host, numa_nodes, gpus"):
        load_topology(tmp_path / "list.yaml")
    with pytest.raises(TopologyError, match="cannot read topology file"):
        load_topology(tmp_path / "missing.json")


def test_without_numa_nodes_a_file_takes_this_hosts(tmp_path: Path) -> None:
    doc = _doc()
    del doc["numa_nodes"]
    for g in doc["gpus"]:
        g["numa_node"] = None
    t = topology_from_dict(doc)
    assert t.numa_nodes == host_numa_nodes()
    assert t.gpu_cpus(t.gpus[0]) == t.cpus


def test_cpulists_and_a_sysfs_tree(tmp_path: Path) -> None:
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    for node, cpus, dist in ((0, "0-1", "10 21"), (1, "2-3", "21 10")):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus + "\n")
        (tmp_path / f"node{node}" / "distance").write_text(dist + "\n")
    nodes = host_numa_nodes(tmp_path)
    assert [(n.id, n.cpus, n.distances) for n in nodes] == [(0, (0, 1), (10, 21)), (1, (2, 3), (21, 10))]
    empty = host_numa_nodes(tmp_path / "none")
    assert len(empty) == 1 and empty[0].id == 0 and len(empty[0].cpus) >= 1


def test_topology_without_a_driver_is_one_line(capsys) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present: discovery is checked by bench/gpu_affinity_check.py there")
    except pynvml.NVMLError:
        pass
    assert main(["affinity", "topology"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("aisp: error: no NVIDIA driver here (NVML: ") and err.count("\n") == 1


def test_serve_refuses_to_start_without_a_token_or_with_a_bad_file(
    monkeypatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.delenv("AISP_AFFINITY_TOKEN", raising=False)
    monkeypatch.delenv("AISP_AFFINITY_TOKEN_FILE", raising=False)
    topology = str(DATA / "mig.json")
    assert main(["affinity", "serve", "--topology", topology, "--db", str(tmp_path / "l.db")]) == 1
    assert capsys.readouterr().err == (
        "aisp: error: aisp affinity serve needs a token for mutating calls: --token-file FILE, "
        "$AISP_AFFINITY_TOKEN_FILE or $AISP_AFFINITY_TOKEN (or --no-auth)\n"
    )
    (tmp_path / "empty").write_text("\n")
    assert main(["affinity", "serve", "--topology", topology, "--token-file", str(tmp_path / "empty")]) == 1
    assert capsys.readouterr().err == f"aisp: error: the affinity token file {tmp_path / 'empty'} is empty\n"
    (tmp_path / "bad.json").write_text("{}")
    assert main(["affinity", "serve", "--topology", str(tmp_path / "bad.json"), "--no-auth"]) == 1
    assert capsys.readouterr().err.startswith(f"aisp: error: {tmp_path / 'bad.json'}: host: Field required")
