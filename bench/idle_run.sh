#!/bin/bash
# The idle benchmark run behind bench/RESULTS.md, one benchmark at a time, in
# order of importance (a run cut short keeps what it finished). Usage, from the project root on
# an otherwise idle machine:
#
#     bench/idle_run.sh WORKSPACE OUT        # e.g. /tmp/bench-ws /tmp/bench-out (about 45 min)
#
# WORKSPACE receives the packs (build_bench keeps its default path's packs there, and the other
# benchmarks read them) and WORKSPACE-scale the 10k/100k/1M packs (about 16 GB); OUT the logs,
# one per step, and steps.log with the start, load average and exit status of each.
set -u
W=$(realpath -m "${1:?workspace folder}"); O=$(realpath -m "${2:?output folder}")
Q=${PYTHON_DOCS_QA:-../shared/benchmarks/python_docs_qa/questions.jsonl}
mkdir -p "$O"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
step() {
    local name=$1; shift
    echo "== $name $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$O/steps.log"
    "$@" > "$O/$name.log" 2> "$O/$name.err"
    echo "   rc=$? $(date -u +%H:%M:%S)" | tee -a "$O/steps.log"
}
PY=.venv/bin/python
step build_bench $PY bench/build_bench.py --workdir "$W" --paths today,default,int8 --out "$O/build_bench.json"
step docs_qa $PY bench/docs_qa_bench.py --workdir "$W" --profiles baseline,balanced,max --out "$O"
step demo_build .venv/bin/kpack build demo
step eval_bench $PY bench/eval_bench.py --workdir "$W" --out "$O" \
    --conditions 'vector (exact scan),balanced profile'
step multihop $PY bench/multihop_bench.py --workdir "$W/mh" --skip-peers --answers \
    --pack "$W/packs/hotpotqa_100"
step fresh $PY bench/scale_bench.py --fresh "$W/packs/squad_wiki6" "$W/packs/python_docs" \
    --questions "$Q" --out "$O/scale_fresh.json"
step serve $PY bench/serve_bench.py --pack "$W/packs/python_docs" --during-publish --others 19 \
    --window 30
step scale $PY bench/scale_bench.py --source "$W/storage" --workdir "$W-scale" \
    --sizes 10000,100000,1000000 --out "$O/scale_bench.json"
echo "== done $(date -u +%H:%M:%S)" | tee -a "$O/steps.log"
