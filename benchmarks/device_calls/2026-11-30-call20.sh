# nvidia-h200 (one GPU), repository root, `.whlmin` carried (README here).
# Issue 7: the sparse benchmark without sweeps on the final DEFAULT, a third run of it (after runs 9 and 10).
mkdir -p /tmp/logs/s
OUT=/tmp/logs/s timeout 200 python -m benchmarks.sparse_attention_h200 --no-sweeps > /tmp/logs/sparse.log 2>&1; echo "sparse rc=$?" >> /tmp/logs/sparse.log
cp /tmp/logs/s/*.json $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs
grep -i "target 0.2\|rc=\|forward:" /tmp/logs/sparse.log | cut -c1-420
