#!/bin/bash
# The authors' K+1 GAN with their target left in train mode (as released) and in eval mode (--target_eval 1), against
# the round-1 models of a finished λ_H = 0 pair run, seeds 0-2 and GAN seeds GSEEDS; then their KED-MI search (λ_H 0).
# Prints and writes OUT/kedmi_target_mode.json: their own SCNN top-1 of every run, keyed s<seed>_g<GAN seed>_te<0|1>.
#
# Usage: kedmi_target_mode.sh PAIR_OUT [EPOCHS=15] [ITERS=300] [GPU=0]   (PAIR_OUT: run.py's --out of the λ_H = 0 cell)
# The python on PATH needs cv2 and pandas (the authors' venv); GSEEDS (default "0 10") and OUT (default PAIR_OUT) from
# the environment. All 2 × 3 × |GSEEDS| runs start at once: on a CPU give few GAN seeds, or GPU=1.
set -u
pair=$(cd "$1" && pwd); EPOCHS=${2:-15}; ITERS=${3:-300}; GPU=${4:-0}; GSEEDS=${GSEEDS:-"0 10"}; out=${OUT:-$pair}
work=$(mktemp -d)
cd "$pair/authors_l0_seed0/code/DMI"
for s in 0 1 2; do for g in $GSEEDS; do for te in 0 1; do
  (tag=s${s}_g${g}_te${te}; gs=$((s + g)); run=$pair/authors_l0_seed$s
   python3 'k+1_gan_fl.py' --dataset mnist --defense reg --split_file "$pair/split_seed$s.npz" --target_path "$run/fl/round_1.tar" \
     --out_dir "$work/gan_$tag" --epochs "$EPOCHS" --lr 1e-3 --batch_size 64 --n_critic 5 --seed $gs --threads 1 --gpu "$GPU" \
     --target_eval $te > "$work/gan_$tag.log" 2>&1 &&
   python3 recovery_batchhsic_fl.py --dataset mnist --priordata mnist --defense reg --attack_improve BATCHHSIC --lamda 0 --sigma 5 \
     --iter "$ITERS" --seeds 50 --repeats 1 --gan_dir "$work/gan_$tag" --target_path "$run/fl/round_1.tar" \
     --eval_path "$run/eval_scnn.tar" --eval_signed 1 --npy_out "$work/k_$tag.npy" --skip_fid 1 --save_img_dir "$work/png_$tag" \
     --seed $gs --threads 1 --gpu "$GPU" > "$work/recovery_$tag.log" 2>&1 || echo "$tag failed: see $work") &
done; done; done; wait
python3 - "$work" "$out" <<'PY'
import glob, json, sys
work, out = sys.argv[1:]
rows = {p.split("/k_")[1][:-5]: json.load(open(p))["acc"] for p in sorted(glob.glob(f"{work}/k_*.json"))}
json.dump(rows, open(f"{out}/kedmi_target_mode.json", "w"), indent=1)
for key, top1 in rows.items():
    print(key, round(top1, 3))
PY
