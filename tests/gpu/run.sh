#!/usr/bin/env bash
# The checks that need a real GPU, in one go: builds braid, runs the nccl
# backend's test cases on the real NCCL and CUDA runtime, the stream/event
# example, the Python CUDA-tensor tests, and braid-perf on backend nccl
# interleaved with the same driver calling NCCL directly (bench/nccl_coll).
#
#   tests/gpu/run.sh OUTDIR [BUILDDIR]
#
# Everything it prints goes to OUTDIR/log.txt as well; the perf JSON lines to
# OUTDIR/perf/*.json. NCCL and the CUDA runtime are looked for under
# /usr/local/cuda and in the Python installation's nvidia-* packages (the ones
# PyTorch uses); BRAID_NCCL_LIB / BRAID_CUDART_LIB override. GPU_PERF_ROUNDS
# (default 3) and GPU_PERF_MAX (default 1G) size the comparison. With
# GPU_BASE_SRC=DIR (another braid checkout, e.g. `git worktree add DIR main`)
# its braid-perf joins the all-reduce rounds too, to measure a change.
# GPU_STEPS (default "tests example python perf") picks the parts to run;
# "hier" adds hier over nccl at two simulated nodes.
set -u
out=${1:?usage: run.sh OUTDIR [BUILDDIR]}
b=${2:-/tmp/braid-gpu-build}
src=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out/perf"
exec > >(tee "$out/log.txt") 2>&1
step() { printf '\n===== %s  (%s)\n' "$*" "$(date +%T)"; }
py=$(command -v python3)

step machine
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
nproc
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1 | tail -1

find_lib() { # NAME PYMODULE: the first copy of library NAME
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/$1" ] && { echo "$d/$1"; return; }
  done
  "$py" -c "import $2, os; print(os.path.join(list($2.__path__)[0], 'lib', '$1'))" 2>/dev/null
}
export BRAID_NCCL_LIB=${BRAID_NCCL_LIB:-$(find_lib libnccl.so.2 nvidia.nccl)}
export BRAID_CUDART_LIB=${BRAID_CUDART_LIB:-$(find_lib libcudart.so.13 nvidia.cuda_runtime)}
echo "NCCL: $BRAID_NCCL_LIB"
echo "CUDA runtime: $BRAID_CUDART_LIB"

step build
ninja=(); command -v ninja >/dev/null && ninja=(-G Ninja)
cmake -S "$src" -B "$b" "${ninja[@]}" -DCMAKE_BUILD_TYPE=Release 2>&1 | grep -E "nccl|CUDA|Error|error" || true
cmake --build "$b" -j "$(nproc)" 2>&1 | grep -E "error|warning|FAILED" || true
[ -x "$b/tests/test_nccl" ] || { echo "BUILD FAILED"; exit 1; }
base=
if [ -n "${GPU_BASE_SRC:-}" ]; then
  cmake -S "$GPU_BASE_SRC" -B "$b-base" "${ninja[@]}" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build "$b-base" -j "$(nproc)" --target braid-perf braidrun >/dev/null 2>&1 &&
    base=$b-base/tools/braid-perf/braid-perf
  echo "base for comparison: ${base:-BUILD FAILED}"
fi
run() { timeout "$@"; echo "exit status: $?" >&2; }
br=$b/tools/braidrun/braidrun

want() { case " ${GPU_STEPS:-tests example python perf} " in *" $1 "*) return 0 ;; esac; return 1; }

if want tests; then
step "test_nccl on the real libraries"
(cd "$b" && BRAID_TEST_NCCL_REAL=1 BRAID_TEST_BINDIR=$b BRAID_TEST_SRCDIR=$src run 300 tests/test_nccl) 2>&1 |
  grep -v "flight recorder"

fi
if want example; then
step "example: stream/event overlap"
run 60 "$br" -n 1 --backend nccl "$b/examples/example_nccl_overlap"

fi
if want python; then
step "Python: CUDA tensors"
PYTHONPATH=$src/python BRAID_LIBRARY=$b/libbraid.so PYTHONUNBUFFERED=1 \
  run 180 "$br" -n 1 --backend nccl "$py" -m pytest -q -p no:cacheprovider -rs "$src/tests/python/test_cuda.py"

fi
if want hier; then
step "perf: hier over nccl, two simulated nodes of one rank sharing the GPU"
# Each node part is a one-rank NCCL communicator; between the nodes tcp on
# loopback. Beside the default (between-node stages in pieces): the same in
# one piece, and the layout with host memory (shm + tcp), which shows what
# staging device memory through the host costs.
for r in $(seq 1 "${GPU_PERF_ROUNDS:-3}"); do
  for op in allreduce broadcast allgather reduce_scatter; do
    for cfg in nccl:4M nccl:0 shm:4M; do
      BRAID_HIER_INTRA=${cfg%:*} BRAID_HIER_PIECE=${cfg#*:} BRAID_CHECK=0 run 120 "$br" -n 2 --backend hier sh -c \
        'BRAID_NODE_ID=node$BRAID_RANK exec "$0" "$@"' "$b/tools/braid-perf/braid-perf" $op -b 1M -e 256M -f 4 --json \
        >"$out/perf/hier-${cfg%:*}-${cfg#*:}.$op.$r.json"
    done
  done
done
"$py" - "$out/perf" <<'PY'
import collections, glob, json, os, statistics, sys
t = collections.defaultdict(list)
for f in glob.glob(os.path.join(sys.argv[1], "hier-*.json")):
    cfg = os.path.basename(f).split(".")[0][5:]
    for line in open(f):
        d = json.loads(line)
        if d.get("wrong"):
            print("WRONG RESULTS:", f, line.strip())
        t[(d["op"], d["size"], d["inplace"], cfg)].append(d["time_us"])
print("op size inplace | median us: nccl pieces, nccl one piece, shm | one piece / pieces")
for key in sorted({k[:3] for k in t}):
    m = [statistics.median(t[key + (c,)]) if t[key + (c,)] else float("nan") for c in ("nccl-4M", "nccl-0", "shm-4M")]
    print(*key, "|", *("%.0f" % x for x in m), "| %.2f" % (m[1] / m[0]))
PY

fi
want perf || { step done; exit 0; }
step "perf: braid over NCCL vs NCCL direct, 1 rank"
max=${GPU_PERF_MAX:-1G}
for r in $(seq 1 "${GPU_PERF_ROUNDS:-3}"); do
  for op in allreduce broadcast allgather reduce_scatter; do
    BRAID_CHECK=0 run 120 "$br" -n 1 --backend nccl "$b/tools/braid-perf/braid-perf" $op -b 8 -e "$max" -f 4 --json \
      >"$out/perf/braid.$op.$r.json"
    run 120 "$br" -n 1 "$b/bench/nccl_coll" $op -b 8 -e "$max" -f 4 --json >"$out/perf/direct.$op.$r.json"
    NCCL_COLL_NONBLOCKING=1 run 120 "$br" -n 1 "$b/bench/nccl_coll" $op -b 8 -e "$max" -f 4 --json \
      >"$out/perf/directnb.$op.$r.json"
    [ "$op" = allreduce ] || continue
    run 120 "$br" -n 1 --backend nccl "$b/tools/braid-perf/braid-perf" $op -b 8 -e "$max" -f 4 --json \
      >"$out/perf/braidcheck.$op.$r.json"
    [ -n "$base" ] && BRAID_CHECK=0 run 120 "$br" -n 1 --backend nccl "$base" $op -b 8 -e "$max" -f 4 --json \
      >"$out/perf/base.$op.$r.json"
  done
done
"$py" "$src/tests/gpu/ratios.py" "$out/perf"
step done
