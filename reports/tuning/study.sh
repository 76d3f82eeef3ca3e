#!/usr/bin/env bash
# The tuning study of reports/tuning/README.md: for each method, its test accuracy on emoji at the reference
# defaults, with settings tuned on emoji's own validation split, and with settings tuned on emoji-vendors' validation
# split (one task of all 36 classes: another protocol on the same training images), then evaluated on emoji's test
# split. Run from the repository root; one process at a time.
set -euo pipefail
TRIALS=${TRIALS:-12}
OUT=reports/tuning
METHODS=${METHODS:-"slda fecam acil dsal randumb ranpac"}
for m in $METHODS; do
  fixed=()
  [ "$m" = ranpac ] && fixed=(--set first_session=false)  # RanPAC without Phase 1: cached-feature trials
  clbench run --strategy "$m" --bench emoji "${fixed[@]}" --out "$OUT/runs/$m-defaults" --overwrite
  for tb in emoji emoji-vendors; do
    clbench tune --strategy "$m" --bench "$tb" --validation 0.2 --trials "$TRIALS" "${fixed[@]}" --out "$OUT/studies/$m-$tb"
    clbench run --config "$OUT/studies/$m-$tb/chosen.yaml" --bench emoji --out "$OUT/runs/$m-tuned-on-$tb" --overwrite
  done
done
python -m clbench.tune.report "$OUT"  # the table of reports/tuning/README.md
