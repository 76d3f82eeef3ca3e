#!/usr/bin/env bash
# The tuning study of reports/tuning/README.md: for each method, its test accuracy on emoji at the reference
# defaults, with settings tuned on emoji's own validation split, and with settings tuned on the validation split of
# a held-out class subset (the first 18 classes of class order seed 7), each evaluated on emoji's test split. No
# test image is read while tuning. Run from the repository root; one process at a time.
set -euo pipefail
TRIALS=${TRIALS:-12}
OUT=reports/tuning
METHODS=${METHODS:-"slda fecam acil dsal randumb tosca ranpac"}
for m in $METHODS; do
  fixed=()
  space=()
  if [ "$m" = ranpac ]; then
    fixed=(--set first_session=false)  # RanPAC without Phase 1: cached-feature trials
    space=(--space "$OUT/ranpac-space.yaml")  # M only, up to 4000 (the file says why)
  fi
  # L2P at a short budget (every run of its three, defaults included): the cached query (profile quick), the first
  # 16 training images of each class, 2 epochs; its lr only (the card's space). Run with TRIALS=6
  [ "$m" = l2p ] && fixed=(--profile quick --train-per-class 16 --set epochs=2)
  if [ ! -f "$OUT/runs/$m-defaults/result.json" ]; then
    clbench run --strategy "$m" --bench emoji "${fixed[@]}" --out "$OUT/runs/$m-defaults" --overwrite
  fi
  if [ ! -f "$OUT/studies/$m-emoji/tuning.json" ]; then
    clbench tune --strategy "$m" --bench emoji --validation 0.2 --trials "$TRIALS" "${fixed[@]}" "${space[@]}" \
      --out "$OUT/studies/$m-emoji"
  fi
  clbench run --config "$OUT/studies/$m-emoji/chosen.yaml" --out "$OUT/runs/$m-tuned-on-emoji" --overwrite
  clbench tune --strategy "$m" --bench emoji --classes 18 --class-order-seed 7 --validation 0.2 --trials "$TRIALS" \
    "${fixed[@]}" "${space[@]}" --out "$OUT/studies/$m-emoji-18-classes"
  clbench run --config "$OUT/studies/$m-emoji-18-classes/chosen.yaml" --class-order-seed 1993 \
    --out "$OUT/runs/$m-tuned-on-18-classes" --overwrite
done
python -m clbench.tune.report "$OUT"  # the table of reports/tuning/README.md
