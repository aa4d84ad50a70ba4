#!/bin/bash
# session 14 call 6: one scale box per stage pair (scale_pairs): sweep, then its GPU tests
source .device/prelude.sh
python3 benchmarks/dev_ab_wfrag.py --sweep box --flush read --nk 7168x18432 18432x7168 --ms 16 32 --rounds 3 --jobs 16 --out $OUT/box.json > $OUT/box.log 2>&1
grep -E "checked|WRONG|FAIL" $OUT/box.log
grep -E "^  (dispatch|nomma|lf sts)" $OUT/box.log
python3 -m pytest -q -m gpu tests/test_streamk.py -x 2>&1 | tail -4 | tee $OUT/pytest_streamk.log
