# session 15, call 7: GPU tests of the scales-ahead tiles, then bench_linear A/B: this tree
# (scale_lsu + scale_ahead at 16-32 tokens) vs .baseline (`git archive f5c88ef nvfp4_ops`,
# carry it with .device), two alternating rounds
set -u
source .device/prelude.sh
timeout -s KILL 200 python3 -m pytest -q -m gpu tests/test_streamk.py -k scale_ahead -p no:cacheprovider > $OUT/pytest_streamk.log 2>&1; echo "pytest rc=$?"
tail -3 $OUT/pytest_streamk.log
for r in 1 2; do
  for t in base new; do
    case $t in new) pp= ;; base) pp=$PWD/.baseline ;; esac
    env PYTHONPATH=$pp${pp:+:}${PYTHONPATH:-} timeout -s KILL 120 python3 benchmarks/bench_linear.py --check --ms 16,32,128 --nks 7168x18432,18432x7168 > $OUT/bench_${t}_$r.log 2>&1
    echo "bench $t $r rc=$?"
  done
done
for f in $OUT/bench_*.log; do echo "== $(basename $f)"; grep -A7 "M     N     K" $f | tail -6; done
