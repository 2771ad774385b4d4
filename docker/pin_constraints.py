"""Write docker/constraints.txt: the runtime dependency closure of pyflink-aisp, pinned to the
versions installed in this environment (run it with the project venv after `make install`):

    .venv/bin/python docker/pin_constraints.py > docker/constraints.txt
"""

from __future__ import annotations

import importlib.metadata as md
import re

from packaging.markers import default_environment
from packaging.requirements import Requirement

HEADER = """\
# Versions the images install (pip -c): the runtime dependency closure of pyflink-aisp as tested in
# the project venv. Regenerate: .venv/bin/python docker/pin_constraints.py > docker/constraints.txt"""


def closure(root: str = "pyflink-aisp") -> dict[str, str]:
    """Distribution name (normalised) -> installed version, for ``root``'s runtime requirements."""
    env = dict(default_environment(), extra="")
    found: dict[str, str] = {}
    todo = list(md.distribution(root).requires or [])
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in found:
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue
        found[name] = dist.version
        todo.extend(dist.requires or [])
    return found


if __name__ == "__main__":
    print(HEADER)
    for name, version in sorted(closure().items()):
        print(f"{name}=={version}")
