#!/usr/bin/env bash
# ansible-test sanity on a copy of the collection at the path ansible-test needs
# (.../ansible_collections/gpulab/vllm), offline, with the checkout's venv.
# The copy holds the tracked files plus untracked ones that are not ignored, so
# new files are checked before their first commit.
#   tests/sanity.sh                      every test that runs offline
#   tests/sanity.sh --test validate-modules plugins/modules/vllm_health.py
#   SANITY_VENV=build/matrix/core-2.17 tests/sanity.sh   another ansible-core (tests/matrix.py)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SANITY_VENV:-$ROOT/.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
VENV_BIN="$VENV/bin"
# ansible-test runs on the venv's Python.
PYTHON_VERSION="$("$VENV_BIN/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
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
PIP_VERSION="$("$VENV_BIN/python" -c 'import sys; from ansible_test._internal.python_requirements import get_venv_packages; from ansible_test._internal.host_configs import NativePythonConfig; print(get_venv_packages(NativePythonConfig(version=sys.argv[1]))["pip"])' "$PYTHON_VERSION" 2>/dev/null || echo 24.2)"
GET_PIP_CACHE="$HOME/.ansible/test/cache/get_pip_${PIP_VERSION//./_}.py"
if ! cmp -s "$ROOT/tests/sanity_get_pip.py" "$GET_PIP_CACHE"; then
  mkdir -p "$(dirname "$GET_PIP_CACHE")"
  cp "$ROOT/tests/sanity_get_pip.py" "$GET_PIP_CACHE"
fi

export PATH="$VENV_BIN:$PATH"
export ANSIBLE_CONFIG=/dev/null
# No network here: ansible-test must not try to install its requirements.
exec ansible-test sanity --python "$PYTHON_VERSION" --local --color no "$@"
