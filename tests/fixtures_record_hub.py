"""Record what a hub answers for a revision's tree (huggingface_hub's list_repo_tree, recursive), as the unit tests of
the weights role's hub fetch read it: tests/unit/fixtures/hub/NAME.json.

    python tests/fixtures_record_hub.py ENDPOINT REPO COMMIT NAME
e.g. with the lab's mirror up (lab/labctl.py hub up, which prints the endpoint, repository and commit).
Run with a Python that has huggingface_hub (the lab hub's venv has it: build/lab/hub-venv/bin/python).
"""

import json
import sys
from pathlib import Path

from huggingface_hub import HfApi


def main(endpoint, repo, commit, name):
    entries = []
    for entry in HfApi(endpoint=endpoint).list_repo_tree(repo, revision=commit, recursive=True):
        lfs = getattr(entry, "lfs", None)
        entries.append({"type": type(entry).__name__, "path": entry.path, "size": getattr(entry, "size", None),
                        "blob_id": getattr(entry, "blob_id", None),
                        "lfs": {"size": lfs.size, "sha256": lfs.sha256, "pointer_size": lfs.pointer_size} if lfs else None})
    out = Path(__file__).resolve().parent / "unit" / "fixtures" / "hub" / (name + ".json")
    out.write_text(json.dumps({"repo": repo, "commit": commit, "tree": entries}, indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main(*sys.argv[1:5])
