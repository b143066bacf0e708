# Records the GPU fixtures of tests/data/torch/recorded/ (see its README): run from a folder holding hook/
# (traces/sources/torch/hook), train.py and ddp.py, with $OUT set; it sets the environment `alloctrace record` sets.
set -u
H=$PWD/hook; R=$OUT/r; mkdir -p $R/train $R/oom $R/sigterm $R/ddp
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt 2>&1
python3 -c "import torch,sys;print(torch.__version__, torch.version.cuda, sys.version)" >> $R/env.txt 2>&1
rec() { d=$1; shift; env PYTHONPATH=$H ALLOCTRACE_TORCH_DIR=$R/$d ALLOCTRACE_TORCH_STACKS=python \
  ALLOCTRACE_TORCH_MAX_ENTRIES=1000000 "$@"; echo "exit $?" >> $R/$d/status; }
rec train timeout -s KILL 100 python3 train.py --steps 5 --truth $R/train/truth.json > $R/train/log 2>&1
rec oom timeout -s KILL 60 python3 train.py --steps 3 --batch 64 --cap-gib 1 --truth $R/oom/truth.json > $R/oom/log 2>&1
rec sigterm timeout -s KILL 80 python3 train.py --steps -1 --truth $R/sigterm/truth.json --ready $R/sigterm/ready \
  > $R/sigterm/log 2>&1 &
for i in $(seq 1 140); do [ -s $R/sigterm/ready ] && break; sleep 0.5; done
[ -s $R/sigterm/ready ] && kill -TERM "$(cat $R/sigterm/ready)"
wait
rec ddp timeout -s KILL 120 torchrun --standalone --nproc_per_node 2 ddp.py --truth-dir $R/ddp > $R/ddp/log 2>&1
ls -la $R/*; cat $R/*/status; tail -5 $R/*/log
cd $OUT && for f in r/*/*.pickle; do gzip -9 -n "$f"; done; tar czf results.tgz r && rm -rf r
