#!/bin/bash
# session 14 call 3: wtile experiment
source .device/prelude.sh
python3 benchmarks/dev_ab_wfrag.py --sweep box --flush read --nk 7168x18432 18432x7168 --ms 16 32 --rounds 3 --jobs 16 --out $OUT/box.json > $OUT/box.log 2>&1
tail -60 $OUT/box.log
