#!/usr/bin/env bash
# Set up the virtualenv (first run only) and run every check CI runs:
# ruff (format + lint), mypy, cfn-lint, and the whole pytest suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# The constraints file pins every package to the versions the suite was run with.
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]' \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

.venv/bin/ruff format --check .
.venv/bin/ruff check .
.venv/bin/mypy
# The CloudFormation templates: no error, and no warning unless the template says why.
.venv/bin/cfn-lint infra/*.yaml

set +e
.venv/bin/pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"
