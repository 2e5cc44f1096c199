#!/usr/bin/env bash
# ansible-test sanity on a copy of the collection at the path ansible-test needs
# (.../ansible_collections/gpulab/vllm), offline, with the checkout's venv.
# The copy holds the tracked files plus untracked ones that are not ignored, so
# new files are checked before their first commit.
# The compile and import tests also run on every node Python (SANITY_NODE_PYTHONS,
# default 3.9 to 3.13): the modules and module_utils run on the nodes, whose Python
# may be older or newer than the controller's.
#   tests/sanity.sh                      every test that runs offline
#   tests/sanity.sh --test validate-modules plugins/modules/vllm_health.py
#   SANITY_VENV=build/matrix/core-2.17 SANITY_NODE_PYTHONS= tests/sanity.sh   another ansible-core, on
#                                        its venv's Python only (tests/matrix.py)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SANITY_VENV:-$ROOT/.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
VENV_BIN="$VENV/bin"
# ansible-test runs on the venv's Python.
PYTHON_VERSION="$("$VENV_BIN/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
read -r -a NODE_PYTHONS <<< "${SANITY_NODE_PYTHONS-3.9 3.10 3.11 3.12 3.13}"
# Each node Python by path (pyenv's shims answer only for one version); the controller's from the venv.
# ansible-test makes its test venvs with the first pythonX.Y on the PATH, whatever path it was given: a folder of
# links to the real interpreters goes in front, so that an inactive pyenv shim is never the one it finds.
PYTHONS="$ROOT/build/sanity/$(basename "$VENV")-pythons"
rm -rf "$PYTHONS"
mkdir -p "$PYTHONS"
TARGETS=(--target-python "$PYTHON_VERSION")
for version in "${NODE_PYTHONS[@]}"; do
  [ "$version" = "$PYTHON_VERSION" ] && continue
  ln -s "$("$ROOT/tests/find_python.sh" "$version")" "$PYTHONS/python$version"
  TARGETS+=(--target-python "$version@$PYTHONS/python$version")
done
DEST="$ROOT/build/sanity/$(basename "$VENV")/ansible_collections/gpulab/vllm"

rm -rf "$DEST"
mkdir -p "$DEST"
cd "$ROOT"
git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' path; do [ -e "$path" ] && printf '%s\0' "$path"; done \
  | tar --null --files-from=- -cf - | tar -xf - -C "$DEST"

cd "$DEST"
git init -q
git add -A
git -c user.name=sanity -c user.email=sanity@localhost commit -q -m "sanity snapshot"

# ansible-test bootstraps pip in its test venvs with a get-pip.py it downloads
# from a host this workplace cannot reach; give it a stand-in (see the file).
for pip_version in $("$VENV_BIN/python" -c 'import sys; from ansible_test._internal.python_requirements import get_venv_packages; from ansible_test._internal.host_configs import NativePythonConfig; print(" ".join(sorted({get_venv_packages(NativePythonConfig(version=v))["pip"] for v in sys.argv[1:]})))' "$PYTHON_VERSION" "${NODE_PYTHONS[@]}" 2>/dev/null || echo 24.2); do
  GET_PIP_CACHE="$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"
  if ! cmp -s "$ROOT/tests/sanity_get_pip.py" "$GET_PIP_CACHE"; then
    mkdir -p "$(dirname "$GET_PIP_CACHE")"
    cp "$ROOT/tests/sanity_get_pip.py" "$GET_PIP_CACHE"
  fi
done

export PATH="$VENV_BIN:$PYTHONS:$PATH"
export ANSIBLE_CONFIG=/dev/null
# No network here: ansible-test must not try to install its requirements.
exec ansible-test sanity --controller "origin:python=$PYTHON_VERSION" "${TARGETS[@]}" --color no "$@"
