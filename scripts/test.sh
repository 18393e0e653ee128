#!/usr/bin/env bash
# Set up the virtualenv (first run only) and run every check CI runs:
# ruff (format + lint), mypy, cfn-lint, and the whole pytest suite. Extra args go to one
# pytest run instead of the two below.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# The constraints file pins every package to the versions the suite was run with.
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]' \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

# OS packages the suite drives: wrk, the frontend benchmark's load generator (its smoke run,
# tests/benchmarks), and HAProxy, the load balancer in front of several frontends
# (tests/faults/cluster.py). Installed where this runs as root with apt; elsewhere, install
# them first (the tests that need HAProxy are skipped without it).
missing=""
for pkg in wrk haproxy; do
  command -v "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
done
if [ -n "$missing" ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  # shellcheck disable=SC2086
  (apt-get update -qq && apt-get install -y -qq $missing) >/dev/null
fi

.venv/bin/ruff format --check .
.venv/bin/ruff check .
.venv/bin/mypy
# The CloudFormation templates: no error, and no warning unless the template says why.
.venv/bin/cfn-lint infra/*.yaml

# pytest's exit code, except that a run which collected no tests (5) is a failure (1).
run_pytest() {
  local rc=0
  .venv/bin/pytest "$@" || rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "pytest $* collected no tests: that is a failure" >&2
    rc=1
  fi
  return "$rc"
}

# Extra args: one pytest run with them, as asked.
if [ "$#" -gt 0 ]; then
  rc=0
  run_pytest "$@" || rc=$?
  exit "$rc"
fi

# The whole suite, in two runs. Most of its time is a few dozen tests that keep a daemon,
# agents and a load generator on the wall clock and leave the CPU mostly idle, so three
# workers (pytest-xdist) run them side by side with the rest: the slow ones first
# (tests/conftest.py), handed out two at a time (--maxschedchunk 2; in larger chunks one
# worker got them all and ran them one after another). The tests marked `alone` judge timing
# that a busy machine would change (latency against the simulator's) and run after, by
# themselves. Both runs must pass and each must find tests.
rc_side=0
run_pytest -n "${MARK_TEST_WORKERS:-3}" --dist load --maxschedchunk 2 -m "not alone" || rc_side=$?
rc_alone=0
run_pytest -m alone || rc_alone=$?
if [ "$rc_side" -ne 0 ]; then exit "$rc_side"; fi
exit "$rc_alone"
