# nvidia-h200 (one GPU), repository root, `.whlmin` carried (README here).
# Issue 7: sparse_call_profile again after `_block_means_qkv` issues its three tile loads together (then the sparse benchmark, no sweeps).
mkdir -p /tmp/logs/p /tmp/logs/s
OUT=/tmp/logs/p timeout 240 python -m benchmarks.sparse_call_profile > /tmp/logs/profile.log 2>&1; echo "profile rc=$?" >> /tmp/logs/profile.log
OUT=/tmp/logs/s timeout 200 python -m benchmarks.sparse_attention_h200 --no-sweeps > /tmp/logs/sparse.log 2>&1; echo "sparse rc=$?" >> /tmp/logs/sparse.log
tar czf $OUT/logs.tgz -C /tmp logs
grep -v "^W1130\|torchao\|^  \"\"\"" /tmp/logs/profile.log | tail -c 3000
grep -i "target 0.2\|rc=\|forward:" /tmp/logs/sparse.log | cut -c1-400
