# session 15, last call: the linear GPU tests on this tree's dispatch (scales ahead, reused
# counters, launch overlap), the stream-K chain test, then one whole bench_linear run
set -u
source .device/prelude.sh
timeout -s KILL 330 python3 -m pytest -q -m gpu tests/test_linear_gpu.py tests/test_wfrag.py -p no:cacheprovider > $OUT/pytest_linear_wfrag.log 2>&1; echo "pytest linear+wfrag rc=$?"
tail -2 $OUT/pytest_linear_wfrag.log
timeout -s KILL 60 python3 -m pytest -q -m gpu tests/test_streamk.py -k chain -p no:cacheprovider > $OUT/pytest_chain.log 2>&1; echo "pytest chain rc=$?"
tail -1 $OUT/pytest_chain.log
timeout -s KILL 200 python3 benchmarks/bench_linear.py --check > $OUT/bench_linear.log 2>&1; echo "bench rc=$?"
grep -A30 "M     N     K" $OUT/bench_linear.log | tail -22
