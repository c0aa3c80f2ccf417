#!/bin/sh
# Build the wheel of an earlier release from its commit, for the rolling-upgrade test.
#
#   tests/data/releases/build_release_wheel.sh COMMIT VERSION
#
# Writes tests/data/releases/receiver-VERSION-py3-none-any.whl. The commit's sources are taken
# with `git archive` (the working tree is left alone), their version is set to VERSION in
# pyproject.toml and receiver/__init__.py, and `pip wheel` builds them. The files in the wheel
# carry the commit's date (SOURCE_DATE_EPOCH), so building the same commit again gives the same
# wheel. PYTHON picks the interpreter (default: the checkout's .venv, else python3).
set -eu

if [ $# -ne 2 ]; then
    echo "usage: $0 COMMIT VERSION" >&2
    exit 2
fi
commit=$1
version=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$root/.venv/bin/python" ]; then PYTHON=$root/.venv/bin/python; else PYTHON=python3; fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/src" "$work/dist"
git -C "$root" archive "$commit" | tar -x -C "$work/src"

# The release's own version, wherever the sources state one.
sed -i "s/^version = \".*\"/version = \"$version\"/" "$work/src/pyproject.toml"
sed -i "s/^__version__ = \".*\"/__version__ = \"$version\"/" "$work/src/receiver/__init__.py"
# (pyproject.toml states none where it reads receiver.__version__: dynamic = ["version"])
grep -q -e "^version = \"$version\"" -e '^dynamic = \["version"\]' "$work/src/pyproject.toml"
grep -q "^__version__ = \"$version\"" "$work/src/receiver/__init__.py"

SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct "$commit")
export SOURCE_DATE_EPOCH
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" "$work/src"

wheel="receiver-$version-py3-none-any.whl"
cp "$work/dist/$wheel" "$here/$wheel"
echo "$here/$wheel (from $(git -C "$root" rev-parse "$commit"))"
