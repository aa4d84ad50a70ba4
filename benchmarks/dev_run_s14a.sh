#!/bin/bash
# session 14 call 7: scale_pairs GPU tests first (killed after 150 s: a hang must not eat the
# call), then the M = 16 sweep
source .device/prelude.sh
timeout -s KILL 150 python3 -m pytest -q -m gpu tests/test_streamk.py -k scale_pairs -x 2>&1 | tail -3 | tee $OUT/pytest_sp.log
grep -q " passed" $OUT/pytest_sp.log && ! grep -q "failed" $OUT/pytest_sp.log || exit 1
timeout -s KILL 240 python3 benchmarks/dev_ab_wfrag.py --sweep box --flush read --nk 7168x18432 18432x7168 --ms 16 --rounds 3 --jobs 16 --out $OUT/box.json > $OUT/box.log 2>&1
grep -E "checked|WRONG|FAIL" $OUT/box.log
grep -E "^  (dispatch|nomma|lf sts)" $OUT/box.log
