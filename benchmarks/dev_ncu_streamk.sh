#!/usr/bin/env bash
# Device (H200), from the project root: ncu of dense WGMMA tiles with and without stream-K at
# (18432, 7168), M = 128 and 16, then dev_ab_wfrag at M = 32 / 199. Output under $OUT.
source .device/prelude.sh
export NVFP4_OPS_CACHE_DIR=/tmp/nvfp4_cache
mkdir -p $OUT/ncu $OUT/ab
NCU=/usr/local/cuda/bin/ncu
SECS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats"
run() {  # name N K M BM R ST SK
  local name=$1; shift
  timeout 120 $NCU --kernel-name regex:W4A16 --launch-skip 2 --launch-count 1 $SECS \
    python3 benchmarks/dev_profile.py wgmma "$@" > $OUT/ncu/$name.txt 2>&1
  echo "$name rc=$?"
}
run r3_base_128 18432 7168 128 128 3 8 0
run r3_sk1_128 18432 7168 128 128 3 6 1
run r2_sk1_128 18432 7168 128 128 2 8 1
run r1_base_16 18432 7168 16 16 1 6 0
run r1_sk4_16 18432 7168 16 16 1 4 4
for f in $OUT/ncu/*.txt; do
  echo "== $(basename $f)"
  grep -E "^  [a-zA-Z]|w4a16wg_" $f | grep -E "w4a16wg_|Duration|Compute \(SM\) Thr|Memory Thr|DRAM Thr|L2 Cache Thr|L1/TEX Cache Thr|Issued Warp|Eligible Warps|No Eligible|Executed Ipc A|SM Busy|Achieved Occ|Registers Per|Grid Size|Max Bandwidth|Mem Busy|Theoretical Occ|Warp Cycles Per Issued" | head -30
done
timeout 240 python3 benchmarks/dev_ab_wfrag.py --ms 32 199 --nk 7168x18432 18432x7168 --sweep small --sweep wgmma --flush read --rounds 2 --jobs 16 --out $OUT/ab/ab.json > $OUT/ab/ab.log 2>&1
echo ab_rc=$?
grep -E "^[0-9]+x.*M=|WRONG|FAIL|^  (wfrag\+wperm|wg 1|wg 3|mma base|bf16)" $OUT/ab/ab.log | tail -60
