# nvidia-h200 (one GPU), repository root, `.whlmin` carried (README here).
# Issue 7: the sparse benchmark without sweeps on the new DEFAULT (means_split); the fp8_rowwise gpu test again.
mkdir -p /tmp/logs/s
timeout 60 python -m pytest -q -p no:cacheprovider tests/kernels/test_fp8_rowwise.py -k gpu > /tmp/logs/gpu_tests.log 2>&1; echo "gpu tests rc=$?" >> /tmp/logs/gpu_tests.log
OUT=/tmp/logs/s timeout 240 python -m benchmarks.sparse_attention_h200 --no-sweeps > /tmp/logs/sparse.log 2>&1; echo "sparse rc=$?" >> /tmp/logs/sparse.log
cp /tmp/logs/s/*.json $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs
tail -3 /tmp/logs/gpu_tests.log
grep -i "target 0.2\|rc=\|forward:" /tmp/logs/sparse.log | cut -c1-420
