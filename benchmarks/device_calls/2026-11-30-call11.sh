# nvidia-h200 (one GPU), repository root, `.whlmin` carried (README here).
# Issue 7: sparse attention again without launch sweeps (a second sample of run 5's ratios, both clocks).
mkdir -p /tmp/logs/s
OUT=/tmp/logs/s timeout 300 python -m benchmarks.sparse_attention_h200 --no-sweeps > /tmp/logs/sparse.log 2>&1; echo "sparse rc=$?" >> /tmp/logs/sparse.log
tar czf $OUT/logs.tgz -C /tmp logs
grep -i "target\|rc=\|forward:" /tmp/logs/sparse.log | cut -c1-420
