#!/usr/bin/env bash
# Every Python the package claims, each in its own virtual environment, installed as README.md
# says: the README's main command (the demo), then the README's test command on the tests that
# differ between interpreters (PYTHON_SUBSET below), and the policy's review test on the NumPy
# series that Python installs.
#
#   bash scripts/each_python.sh            # every version pyproject.toml's classifiers name
#   bash scripts/each_python.sh 3.10 3.13  # only these
#   EACH_PYTHON_SKIP=3.11 bash scripts/each_python.sh   # all but one (CI: 3.11 runs it all)
#
# An interpreter is looked for as python3.X on PATH, then under pyenv's versions and
# /usr/bin; a version with none is reported as NOT TESTED. Exit status: 0 all passed, 1 one
# failed, 3 none failed but one or more could not be found (CI says so and goes on).
set -euo pipefail
cd "$(dirname "$0")/.."

# The tests that depend on the interpreter: the wire (pickle internals, the audit-hook guard,
# the callable policy and its NumPy review), RPC over real gRPC, RRefs, autograd and
# distributed autograd.
PYTHON_SUBSET=(tests/wire tests/rpc tests/rref tests/rref_rpc tests/autograd tests/dist_autograd
  tests/test_packaging.py)

readme_command() {  # the fenced command after the marker <!-- $1 --> in README.md
  awk -v marker="<!-- $1 -->" '
    $0 == marker { found = 1; next }
    found && /^```/ { if (inside) exit; inside = 1; next }
    found && inside { print }
  ' README.md
}

claimed_versions() {  # "3.10 3.11 ..." from pyproject.toml's classifiers
  sed -n 's/.*"Programming Language :: Python :: \(3\.[0-9][0-9]*\)".*/\1/p' pyproject.toml
}

find_python() {  # find_python 3.X: a path to a working interpreter of that version, or nothing
  local version=$1 candidate
  local pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
  for candidate in "python$version" "$pyenv_root"/versions/"$version".*/bin/"python$version" \
    "/usr/bin/python$version" "/usr/local/bin/python$version"; do
    if "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$version'.split('.'))))" \
      >/dev/null 2>&1; then
      command -v "$candidate" || echo "$candidate"
      return 0
    fi
  done
  return 1
}

in_env() {  # in_env COMMAND PYTHON VENV: README's command with its python3 and .venv replaced
  printf '%s' "$1" | sed -e "s#python3 -m venv#$2 -m venv#g" -e "s#\.venv\b#$3#g"
}

main_command=$(readme_command main-command)
test_command=$(readme_command test-command)
case "$main_command $test_command" in
  *"python3 -m venv .venv"*"python3 -m venv .venv"*) ;;
  *) echo "each_python: the README's commands no longer start with 'python3 -m venv .venv'" >&2; exit 1 ;;
esac

if [ "$#" -gt 0 ]; then versions=("$@"); else mapfile -t versions < <(claimed_versions); fi
[ "${#versions[@]}" -gt 0 ] || { echo "each_python: no Python versions to test" >&2; exit 1; }
skip=" ${EACH_PYTHON_SKIP:-} "

failed=()
missing=()
tested=()
for version in "${versions[@]}"; do
  case "$skip" in *" $version "*) echo "== Python $version: skipped here (EACH_PYTHON_SKIP)"; continue ;; esac
  if ! python=$(find_python "$version"); then
    echo "== Python $version: NOT TESTED: no python$version on PATH, under ${PYENV_ROOT:-$HOME/.pyenv}/versions or /usr/bin"
    missing+=("$version")
    continue
  fi
  venv=".venv-py${version/./}"
  echo "== Python $version ($python) in $venv: the README's main command"
  rm -rf "$venv"
  if ! bash -c "$(in_env "$main_command" "$python" "$venv")"; then
    echo "each_python: Python $version: the README's main command failed" >&2
    failed+=("$version (main command)")
    continue
  fi
  "$venv/bin/python" -c 'import sys, numpy, grpc, google.protobuf as p; print("python", sys.version.split()[0], "numpy", numpy.__version__, "grpcio", grpc.__version__, "protobuf", p.__version__)'
  echo "== Python $version: the README's test command on ${PYTHON_SUBSET[*]}"
  if ! bash -c "$(in_env "$test_command" "$python" "$venv") -q -p no:cacheprovider ${PYTHON_SUBSET[*]}"; then
    failed+=("$version (tests)")
  else
    tested+=("$version")
  fi
done

[ "${#missing[@]}" = 0 ] || echo "each_python: NOT TESTED (no interpreter found): ${missing[*]}"
if [ "${#failed[@]}" != 0 ]; then
  echo "each_python: FAILED: ${failed[*]}"
  exit 1
fi
[ "${#missing[@]}" = 0 ] || exit 3
echo "each_python: passed on ${tested[*]}"
