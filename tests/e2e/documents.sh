#!/usr/bin/env bash
# Documents. (1) prep records each input file as a document (/documents),
# and inspect reports them. (2) [data] document_mask = true trains the same
# numbers at every layout as on one rank (the layout-equivalence tolerance,
# 1e-5 relative: layout_equivalence.sh), for GPT-2, Llama and a Mixture of
# Experts, with data and pipeline parallelism, interleaving, zb-h1, tensor
# and sequence parallelism, context parallelism (cp 2 and 4, both
# families), experts over ranks, ZeRO and recomputation;
# bf16 and fp16 follow fp32; the mask is in effect (the masked run's losses
# differ from the unmasked one's); the planner's share of attention kept
# is the data's. Each token's loss
# equalling its document's alone is tests/unit/test_document_mask.cpp's.
# (3) Damaged document offsets: exit 2, naming the file and the field.
source "$(dirname "$0")/lib.sh"
: "${H5_DAMAGE:?}"
# Tiny Shakespeare's first 60 KB, one file per speech (a blank line ends
# one): documents of 20 to a few hundred bytes, so most 64-byte windows
# hold a boundary.
mkdir -p speeches
head -c 60000 "$SOURCE_DIR/inputs/tinyshakespeare.txt" |
  awk 'BEGIN { RS = ""; ORS = "\n" } { f = sprintf("speeches/%04d.txt", NR); print > f; close(f) }'
n=$(ls speeches | wc -l)
"$MPIFORMER" prep --tokenizer byte --val-fraction 0.1 --output docs.h5 speeches/*.txt >/dev/null 2>&1 ||
  fail "prep of $n files"
"$MPIFORMER" inspect docs.h5 >inspect.txt
has -E "^documents: [0-9]+ recorded" inspect.txt || { cat inspect.txt; fail "inspect shows no documents"; }
echo "prep: $n speeches; $(grep '^documents' inspect.txt)"

common=(--set data.train=docs.h5 --set data.val=docs_val.h5 --set train.steps=4
        --set train.log_every=1 --set train.eval_every=2 --set train.global_batch=16
        --set train.micro_batch=4 --set train.eval_batches=1)
run() {  # NAME NP DECK ARGS...
  local name=$1 np=$2 deck=$3
  shift 3
  run_mpi "$np" train "$SOURCE_DIR/inputs/$deck" "${common[@]}" --set run.dir="$name" "$@" \
    >"$name.log" 2>&1 || { cat "$name.log"; fail "run $name failed"; }
}
compare() {  # REFERENCE NAME [min_difference]: within 1e-5 (or, with a third
  # argument, at least that far apart somewhere)
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" "$2" "${3:-}" <<'PY'
import json, sys
ref = [j for j in map(json.loads, open(sys.argv[1])) if "step" in j]
got = [j for j in map(json.loads, open(sys.argv[2])) if "step" in j]
assert len(ref) == len(got) == 6, (len(ref), len(got))
worst = 0.0
for r, g in zip(ref, got):
    for key in ("loss", "grad_norm", "val_loss"):
        if key in r:
            worst = max(worst, abs(g[key] - r[key]) / abs(r[key]))
if sys.argv[4]:
    assert worst >= float(sys.argv[4]), f"{sys.argv[3]}: the mask changes nothing ({worst:.2e})"
    print(f"{sys.argv[3]}: differs from the unmasked run by {worst:.2e} (the mask is in effect)")
else:
    assert worst <= 1e-5, f"{sys.argv[3]}: {worst:.2e} from one rank"
    print(f"{sys.argv[3]}: matches one rank, worst relative difference {worst:.2e}")
PY
}
mask=(--set data.document_mask=true)
run g1 1 tiny.toml "${mask[@]}"
run plain 1 tiny.toml
compare g1 plain 1e-3
run g_dp2 2 tiny.toml "${mask[@]}" --set parallel.dp=2
compare g1 g_dp2
run g_pp2_zb 2 tiny.toml "${mask[@]}" --set parallel.pp=2 --set parallel.schedule=zb-h1
compare g1 g_pp2_zb
run g_pp2_int 2 tiny.toml "${mask[@]}" --set parallel.pp=2 --set parallel.schedule=interleaved \
  --set parallel.virtual_stages=2 --set train.recompute='"attention"'
compare g1 g_pp2_int
run g_tp2_sp 2 tiny.toml "${mask[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true
compare g1 g_tp2_sp
run g_dp2_z3 2 tiny.toml "${mask[@]}" --set parallel.dp=2 --set parallel.zero=3 \
  --set train.recompute='"full"'
compare g1 g_dp2_z3
# Context parallelism: each rank's chunks' documents found from the
# positions (a document crosses chunks and ranks), blocks of other
# documents skipped.
run g_cp2 2 tiny.toml "${mask[@]}" --set parallel.cp=2
compare g1 g_cp2
run g_cp4 4 tiny.toml "${mask[@]}" --set parallel.cp=4
compare g1 g_cp4
llama=(--set model.n_layer=2 --set model.seq_len=64 --set data.vocab_size=256 --set model.vocab_size=256)
run l1 1 llama-tiny.toml "${mask[@]}" "${llama[@]}"
run l_pp2 2 llama-tiny.toml "${mask[@]}" "${llama[@]}" --set parallel.pp=2
compare l1 l_pp2
run l_tp2 2 llama-tiny.toml "${mask[@]}" "${llama[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true
compare l1 l_tp2
run l_cp2 2 llama-tiny.toml "${mask[@]}" "${llama[@]}" --set parallel.cp=2
compare l1 l_cp2
# A Megatron dataset's document index gives the same boundaries as
# /documents: the same run, the same numbers.
"$MPIFORMER" prep --tokenizer byte --val-fraction 0.1 --format megatron --output mg.bin \
  speeches/*.txt >/dev/null 2>&1 || fail "prep --format megatron"
run g_megatron 1 tiny.toml "${mask[@]}" --set data.train=mg.bin --set data.val=mg_val.bin
compare g1 g_megatron
# A Mixture of Experts, its experts over 2 ranks.
run m1 1 llama-moe-tiny.toml "${mask[@]}" --set model.n_layer=2
run m_ep2 2 llama-moe-tiny.toml "${mask[@]}" --set model.n_layer=2 --set parallel.dp=2 --set parallel.ep=2
compare m1 m_ep2

# 16-bit precisions under the mask: the fp32 run's losses within 1e-3
# relative (5e-5 seen over these 4 steps: the rounding of activations
# averages out in a mean loss), where dropping the mask moves them by 6e-3
# (the unmasked comparison above).
for p in bf16 fp16; do
  run "g_$p" 1 tiny.toml "${mask[@]}" --set train.precision="\"$p\""
  python3 - g1/metrics.jsonl "g_$p/metrics.jsonl" "$p" <<'PY'
import json, sys
ref = [j for j in map(json.loads, open(sys.argv[1])) if "loss" in j]
got = [j for j in map(json.loads, open(sys.argv[2])) if "loss" in j]
worst = max(abs(g["loss"] - r["loss"]) / r["loss"] for r, g in zip(ref, got))
assert len(got) == 4 and worst <= 1e-3, (len(got), worst)
print(f"{sys.argv[3]} under the mask: within {worst:.2e} of fp32")
PY
done

# The planner prices a GPU's attention at the share of causal pairs the
# mask keeps, measured over the first 64 windows: the same share computed
# here from /documents (h5dump) and the window arithmetic alone.
"$MPIFORMER" plan "$SOURCE_DIR/inputs/tiny.toml" "${common[@]}" "${mask[@]}" \
  --machine "$SOURCE_DIR/inputs/machines/h200-single.toml" --ranks 1 --set train.precision='"bf16"' \
  >plan.log 2>&1 || { cat plan.log; fail "plan"; }
h5dump -d /documents -y -w 0 docs.h5 >offsets.txt
python3 - plan.log offsets.txt <<'PY'
import re, sys
got = float(re.search(r"the mask keeps ([0-9.]+)% of causal", open(sys.argv[1]).read())[1]) / 100
data = open(sys.argv[2]).read().split("DATA {", 1)[1].split("}", 1)[0]
starts = [int(x) for x in re.findall(r"[0-9]+", data)]
T, share = 64, 0.0
for w in range(64):
    cut = [s - w * T for s in starts if w * T < s < w * T + T] + [T]
    pairs, frm = 0, 0
    for to in cut:
        pairs += (to - frm) * (to - frm + 1) / 2
        frm = to
    share += pairs / (T * (T + 1) / 2)
want = share / 64
assert abs(got - want) < 0.0006, (got, want)  # the log's 0.1% rounding
assert want < 0.9, want
print(f"plan: the mask keeps {100 * got:.1f}% of attention's causal pairs (computed here: {100 * want:.2f}%)")
PY

# (3) Offsets that decrease, or point past the tokens.
bad() {  # INDEX VALUE "message part"
  cp docs.h5 bad.h5
  "$H5_DAMAGE" setelem bad.h5 /documents "$1" "$2" || fail "could not damage the offsets"
  local rc=0
  run_mpi 2 train "$SOURCE_DIR/inputs/tiny.toml" "${common[@]}" "${mask[@]}" --set data.train=bad.h5 \
    --set parallel.dp=2 --set run.dir=bad >bad.log 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || fail "damaged /documents[$1] = $2 trained"
  has -F -- "$3" bad.log || { cat bad.log; fail "no '$3'"; }
  echo "ok: /documents[$1] = $2: $3"
}
last=$(( $(grep -o '^documents: [0-9]*' inspect.txt | cut -d' ' -f2) - 1 ))
bad "$last" 999999999 "bad.h5: /documents[$last]: 999999999 points past the"
bad 0 7 "bad.h5: /documents[0]: 7: the first document starts at token 0"
bad 3 2 "bad.h5: /documents[3]: 2 is not above the offset before it"
