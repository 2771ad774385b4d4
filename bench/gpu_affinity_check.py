"""GPU check of the affinity service (issue 12): real NVML topology, a lease, and scoring on the leased GPU.

Not a test. For the GPU host (Python 3.12, torch with CUDA, nvidia-ml-py,
tokenizers, safetensors, numpy; no PyFlink, Java, FastAPI or uvicorn): it uses
the service's store and placement in-process, as ``aisp affinity serve`` would
behind its HTTP API, and never imports pyflink. Steps, each printed:

1. the host's topology from NVML, as ``aisp affinity topology`` prints it
   (``--topology FILE`` instead: a dry run on a host without a GPU);
2. leases for subtasks 0..``--subtasks``-1 of one operator from a
   :class:`~pyflink_aisp.affinity.LeaseStore` (SQLite in a temporary folder),
   with the placement's explanation;
3. :func:`~pyflink_aisp.affinity.apply_lease` for ``--subtask``: ``CUDA_VISIBLE_DEVICES``
   = the leased GPU or MIG uuid (before CUDA initialises), every thread pinned to
   the lease's CPU set;
4. the torch sentiment handler on ``cuda:0`` (= the leased device) scores a few
   real reviews; printed: the device torch sees (name, uuid), where the encoder's
   parameters are, the CPU set of every thread of the process, the scores;
5. the lease released.

Exit status: 0 scored on the leased GPU; 2 no NVIDIA driver or no CUDA device
after the lease was applied (nothing is scored: never on the CPU instead);
1 another error. Leaves the GPU's settings (MIG included) as they are: NVML is
only read.

Run from the repository root::

    PYTHONPATH=. python bench/gpu_affinity_check.py [--mem-mib 2048] [--texts 8]
        [--model-dir DIR] [--weights-dir DIR] [--texts-file reviews.txt]
    PYTHONPATH=. python bench/gpu_affinity_check.py --topology host.json   # dry run, no GPU
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXIT_NO_GPU = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topology", type=Path, default=None, help="topology file instead of NVML (dry run)")
    p.add_argument("--subtasks", type=int, default=2, help="subtasks of the operator to place")
    p.add_argument("--subtask", type=int, default=0, help="the subtask this process plays")
    p.add_argument("--mem-mib", type=int, default=2048, help="GPU memory each lease reserves")
    p.add_argument("--texts", type=int, default=8, help="reviews to score")
    p.add_argument("--texts-file", type=Path, default=None, help="one review per line (else the corpus)")
    p.add_argument("--model-dir", type=Path, default=None, help="built assets (default: the cached build)")
    p.add_argument("--weights-dir", type=Path, default=None, help="model.safetensors + config.json")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    args = p.parse_args(argv)
    if not 0 <= args.subtask < args.subtasks:
        p.error(f"--subtask must be within 0..{args.subtasks - 1}")
    return args


def worker_numa_node(topology: Any) -> int | None:
    """The NUMA node holding every CPU this process may run on, if there is one."""
    allowed = os.sched_getaffinity(0)
    nodes = [n.id for n in topology.numa_nodes if allowed <= set(n.cpus)]
    return nodes[0] if len(nodes) == 1 else None


def place_subtasks(topology: Any, args: argparse.Namespace, db: Path) -> tuple[Any, Any]:
    """Leases for subtasks 0..N-1 (printed); returns (store, this subtask's lease)."""
    from pyflink_aisp.affinity import LeaseKind, LeaseStore, PlacementRequest

    store = LeaseStore(db, topology)
    node = worker_numa_node(topology)
    leases = []
    for s in range(args.subtasks):
        request = PlacementRequest(
            job="gpu-affinity-check",
            operator="score",
            subtask=s,
            kind=LeaseKind.GPU,
            mem_bytes=args.mem_mib * 2**20,
            worker_numa_node=node,
        )
        lease, _ = store.acquire(request)
        leases.append(lease)
        print(
            f"lease subtask {s}: {lease.device} (gpu {lease.gpu_index}, mig {lease.mig}) "
            f"numa {lease.numa_node} "
            f"cpus {_cpus(lease.cpus)}\n  why: {lease.reason}"
        )
    return store, leases[args.subtask]


def _cpus(cpus: Any) -> str:
    from pyflink_aisp.affinity._cli import _cpulist

    return _cpulist(cpus)


def thread_cpus() -> dict[int, str]:
    """CPU set of every thread of this process."""
    return {int(t): _cpus(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}


def load_texts(args: argparse.Namespace) -> list[str]:
    if args.texts_file is not None:
        lines = [line.strip() for line in args.texts_file.read_text(encoding="utf-8").splitlines()]
        return [line for line in lines if line][: args.texts]
    from pyflink_aisp.datasets import load_rotten_tomatoes

    return [r.text for r in load_rotten_tomatoes()[: args.texts]]


def score_on_leased_gpu(lease: Any, args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print(
            f"gpu_affinity_check: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} applied, "
            f"but torch {torch.__version__} sees no CUDA device: nothing scored (never on the CPU instead)"
        )
        return EXIT_NO_GPU
    props = torch.cuda.get_device_properties(0)
    print(
        f"torch sees {torch.cuda.device_count()} device(s); cuda:0 = {props.name} uuid "
        f"{getattr(props, 'uuid', '?')} (lease {lease.device})"
    )
    from pyflink_aisp.inference.handlers import TorchSentimentHandler
    from pyflink_aisp.models import ensure_model_assets, load_model_assets

    assets = load_model_assets(args.model_dir) if args.model_dir else ensure_model_assets()
    handler = TorchSentimentHandler(
        assets, device="cuda:0", weights_dir=args.weights_dir, precision=args.precision
    )
    model = handler.load_model()
    texts = load_texts(args)
    predictions = handler.run_inference(texts, model)
    placed = next(model.encoder.parameters()).device
    print(f"encoder parameters on {placed}; {len(texts)} review(s) scored")
    for text, (score, _) in zip(texts, predictions, strict=True):
        print(f"  P(fresh) {float(score):.4f}  {text[:70]!r}")
    print(
        f"threads' CPU sets after loading: {sorted(set(thread_cpus().values()))} "
        f"(lease cpus {_cpus(lease.cpus)})"
    )
    return 0 if placed.type == "cuda" else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from pyflink_aisp.affinity import apply_lease, discover
    from pyflink_aisp.affinity._cli import format_topology
    from pyflink_aisp.errors import AffinityError

    try:
        topology = discover(args.topology)
    except AffinityError as exc:
        print(f"gpu_affinity_check: {exc}")
        return EXIT_NO_GPU
    print("\n".join(format_topology(topology)))
    with tempfile.TemporaryDirectory(prefix="aisp-affinity-check-") as tmp:
        try:
            store, lease = place_subtasks(topology, args, Path(tmp) / "leases.db")
            apply_lease(lease)
        except AffinityError as exc:
            print(f"gpu_affinity_check: {exc}")
            return 1
        print(
            f"applied lease {lease.id}: CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']} "
            f"process cpus {_cpus(os.sched_getaffinity(0))}"
        )
        try:
            return score_on_leased_gpu(lease, args)
        finally:
            released = store.release(lease.id)
            print(f"released lease {released.id} ({released.state.value})")
            store.close()


if __name__ == "__main__":
    sys.exit(main())
