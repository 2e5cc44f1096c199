#!/usr/bin/env bash
# Print the path of a working pythonX.Y: the newest ~/.pyenv/versions/X.Y.* (pyenv's shims answer
# only for the selected version), else pythonX.Y from the PATH if it runs. Exit 1 if there is none.
#   tests/find_python.sh 3.12
set -euo pipefail
version="$1"
while IFS= read -r candidate; do
  if "$candidate" -c '' >/dev/null 2>&1; then
    command -v "$candidate"
    exit 0
  fi
done < <(printf '%s\n' "$HOME"/.pyenv/versions/"$version".*/bin/python"$version" | sort -rV; echo "python$version")
echo "find_python: no working python$version (looked in ~/.pyenv/versions/$version.*/bin and on the PATH)" >&2
exit 1
