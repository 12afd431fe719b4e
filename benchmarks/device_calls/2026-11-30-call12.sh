# nvidia-h200 (one GPU), repository root, `.whlmin` carried (README here).
# Issue 7: where one block-sparse call's time goes, in two q/k/v layouts (benchmarks/sparse_call_profile.py).
mkdir -p /tmp/logs/p
OUT=/tmp/logs/p timeout 240 python -m benchmarks.sparse_call_profile > /tmp/logs/profile.log 2>&1; echo "profile rc=$?" >> /tmp/logs/profile.log
tar czf $OUT/logs.tgz -C /tmp logs
grep -v "^W1130\|torchao\|^  \"\"\"" /tmp/logs/profile.log | tail -c 3000
