# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Record bench/tests/fixtures/faults from the last `bench/run.py --steps faults` (bench/results).

    python bench/tests/record_fault_fixtures.py

For each fault row run: its playbook output trimmed to the error lines and the recap, with this checkout's path
replaced by COLLECTION, and the verdict the benchmark gave it; and the warm-up deploy's timeline
(deploy_timeline.jsonl: task names, hosts and times only). The lab's secrets are checked absent before writing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

import benchlib  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RESULTS = BENCH / "results"


def scrub(text: str, secrets: dict) -> str:
    for name, value in secrets.items():
        if value and value in text:
            raise SystemExit("refusing to record: the output holds %s" % name)
    return text.replace(str(RESULTS / "trees" / "snapshot" / "ansible_collections" / "gpulab" / "vllm"), "COLLECTION") \
               .replace(str(benchlib.ROOT), "COLLECTION")


def main() -> int:
    secrets = benchlib.inventory_secrets(benchlib.read_inventory())
    results = json.loads((RESULTS / "results.json").read_text())
    folder = FIXTURES / "faults"
    folder.mkdir(parents=True, exist_ok=True)
    for key, entry in (results.get("faults") or {}).items():
        run = entry["runs"][-1]
        lines = (RESULTS / "logs" / (run["label"] + ".log")).read_text().splitlines()
        # A failed run: its error lines and the recap. A repaired one: the whole output (the naming line is a wrapped
        # task message, and its time is the play's own clock above it).
        kept = lines if run["rc"] == 0 else [line for line in lines if line.startswith("[ERROR]: Task failed") or " : ok=" in line]
        record = {"key": key, "rc": run["rc"], "named": run["named"], "said": scrub(run["said"], secrets),
                  "output": scrub("\n".join(kept), secrets)}
        (folder / (key + ".json")).write_text(json.dumps(record, indent=1) + "\n")
    warm = sorted((RESULTS / "logs").glob("*-deploy-snapshot.jsonl"))[0]
    (FIXTURES / "deploy_timeline.jsonl").write_text(scrub(warm.read_text(), secrets))
    print("wrote %d fault records and the deploy's timeline" % len(results.get("faults") or {}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
