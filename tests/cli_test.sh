#!/usr/bin/env bash
# End-to-end checks of the kforge command line: compile, inspect, and the
# errors a user sees for bad input.
# Usage: cli_test.sh PATH/TO/kforge
set -euo pipefail

KFORGE=${1:?usage: cli_test.sh PATH/TO/kforge}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

MODULE=sparse_mla_decode_h8_d512r64_topk2048_bf16_pb64_sc0p0625_lse_sm120a
FAILED=0

fail() {
  echo "FAIL: $*" >&2
  FAILED=1
}

# expect_error "what" "message substring" kforge-args...
# The command must exit non-zero and print the substring (stdout or stderr).
expect_error() {
  local what=$1 needle=$2
  shift 2
  local out rc=0
  out=$("$KFORGE" "$@" 2>&1) || rc=$?
  if [[ $rc -eq 0 ]]; then
    fail "$what: exit 0, expected an error (output: $out)"
  elif ! grep -qiF -- "$needle" <<<"$out"; then
    fail "$what: exit $rc but the message does not mention '$needle': $out"
  else
    echo "ok: $what (exit $rc): $(head -n1 <<<"$out")"
  fi
}

# --- compile ---------------------------------------------------------------
# An image an earlier module of the name left (a module of more programs)
# is removed, so it never reads as this module's.
mkdir -p "$TMP/out"
printf 'stale\n' >"$TMP/out/$MODULE.cubin.7"
"$KFORGE" compile --preset glm-5 --tp 8 --arch sm_120a -o "$TMP/out" \
  >"$TMP/compile.txt"
cat "$TMP/compile.txt"
[[ -s "$TMP/out/$MODULE.cubin" ]] || fail "missing $TMP/out/$MODULE.cubin"
[[ -s "$TMP/out/$MODULE.cubin.1" ]] || fail "missing $TMP/out/$MODULE.cubin.1 (the combine's image)"
[[ -s "$TMP/out/$MODULE.json" ]] || fail "missing $TMP/out/$MODULE.json"
[[ ! -e "$TMP/out/$MODULE.cubin.7" ]] || fail "a stale $MODULE.cubin.7 was left beside the module"
# s_q is not part of the kernel: --s-q 1 and --s-q 2 give one key.
key_of() { grep -o '"key": "[0-9a-f]*"' "$1" | head -n1; }
# --source also writes the instantiation unit NVRTC compiled
# (bench/compile_phases.py times it); the kernel is the same.
"$KFORGE" compile --preset glm-5 --tp 8 --arch sm_120a --s-q 1 --source -o "$TMP/sq1" \
  >/dev/null || fail "compile --s-q 1 --source failed"
"$KFORGE" compile --preset glm-5 --tp 8 --arch sm_120a --s-q 2 -o "$TMP/sq2" >/dev/null ||
  fail "compile --s-q 2 failed"
k1=$(key_of "$TMP/sq1/$MODULE.json"); k2=$(key_of "$TMP/sq2/$MODULE.json")
[[ -n "$k1" && "$k1" == "$k2" ]] || fail "--s-q 1 and --s-q 2 give different keys: '$k1' '$k2'"
echo "ok: --s-q 1 and --s-q 2 give one key ($k1)"
grep -qF 'sparse_mla_decode_main(const ks::DecodeParams p)' "$TMP/sq1/$MODULE.cu" ||
  fail "compile --source wrote no unit with the main entry: $TMP/sq1/$MODULE.cu"
[[ ! -e "$TMP/out/$MODULE.cu" ]] || fail "compile without --source wrote $MODULE.cu"
cmp -s "$TMP/sq1/$MODULE.cubin" "$TMP/sq2/$MODULE.cubin" ||
  fail "compile --source changed the cubin"
echo "ok: compile --source writes the unit, the same cubin"
python3 -m json.tool "$TMP/out/$MODULE.json" >/dev/null ||
  fail "$MODULE.json is not valid JSON"
grep -qF "\"module_name\": \"$MODULE\"" "$TMP/out/$MODULE.json" ||
  fail "$MODULE.json does not name the module"

# --- inspect ---------------------------------------------------------------
"$KFORGE" inspect "$TMP/out/$MODULE.cubin" >"$TMP/inspect.txt"
cat "$TMP/inspect.txt"
for needle in sm_120a sparse_mla_decode_main sparse_mla_decode_combine; do
  grep -qF "$needle" "$TMP/inspect.txt" || fail "inspect does not print $needle"
done

"$KFORGE" inspect --json "$TMP/out/$MODULE.cubin" >"$TMP/inspect.json"
python3 -m json.tool "$TMP/inspect.json" >/dev/null ||
  fail "inspect --json is not valid JSON: $(cat "$TMP/inspect.json")"
for needle in sm_120a sparse_mla_decode_main sparse_mla_decode_combine; do
  grep -qF "$needle" "$TMP/inspect.json" || fail "inspect --json lacks $needle"
done

# --- bad input ---------------------------------------------------------------
expect_error "unknown preset" "preset" \
  compile --preset no-such-model --arch sm_90a -o "$TMP/bad"
expect_error "--tp 3 for glm-5" "tensor_parallel" \
  compile --preset glm-5 --tp 3 --arch sm_90a -o "$TMP/bad"
expect_error "--arch sm_75" "sm_75" \
  compile --preset glm-5 --tp 8 --arch sm_75 -o "$TMP/bad"
expect_error "missing --arch" "--arch" \
  compile --preset glm-5 --tp 8 -o "$TMP/bad"
printf 'this is not an ELF file\n' >"$TMP/not.cubin"
expect_error "inspect of a non-cubin" "not.cubin" inspect "$TMP/not.cubin"
expect_error "inspect of a missing file" "missing.cubin" \
  inspect "$TMP/missing.cubin"
expect_error "unknown flag" "--no-such-flag" \
  compile --preset glm-5 --arch sm_90a --no-such-flag
expect_error "unknown command" "frobnicate" frobnicate
# A failed compile writes nothing.
if [[ -e "$TMP/bad" ]] && [[ -n $(find "$TMP/bad" -type f) ]]; then
  fail "failed compiles left files: $(find "$TMP/bad" -type f)"
fi

# fp8_ds_mla: --kv-dtype on a preset brings the preset's scale convention.
"$KFORGE" compile --preset glm-5 --tp 8 --kv-dtype fp8_ds_mla --arch sm_120a -o "$TMP/fp8" \
  >/dev/null || fail "compile --kv-dtype fp8_ds_mla failed"
FP8_MODULE=sparse_mla_decode_h8_d512r64_topk2048_fp8_ds_mla_arbitrary_pb64_sc0p0625_lse_sm120a
[[ -s "$TMP/fp8/$FP8_MODULE.cubin" ]] || fail "missing $TMP/fp8/$FP8_MODULE.cubin"
"$KFORGE" manifest --preset deepseek-v3.2 --tp 8 --kv-dtype fp8_ds_mla --arch sm_90a \
  >"$TMP/fp8_manifest.json" || fail "manifest --kv-dtype fp8_ds_mla failed"
grep -q '"kv_scale_format": "KV_SCALE_FORMAT_POW2"' "$TMP/fp8_manifest.json" ||
  fail "deepseek-v3.2 fp8 manifest does not carry pow2 scales"
expect_error "--kv-dtype fp4" "--kv-dtype: got \"fp4\"" compile --preset glm-5 --kv-dtype fp4 --arch sm_90a \
  -o "$TMP/x"
# The issue-15 records: nvfp4_ds_mla on a preset (V3.2 geometry); the V4
# records from a spec file with rope_dim 0, and on a preset the field named.
"$KFORGE" manifest --preset glm-5 --tp 8 --kv-dtype nvfp4_ds_mla --arch sm_120a \
  >"$TMP/fp4_manifest.json" || fail "manifest --kv-dtype nvfp4_ds_mla failed"
grep -q '"kv_cache_dtype": "KV_CACHE_DTYPE_NVFP4_DS_MLA"' "$TMP/fp4_manifest.json" ||
  fail "nvfp4 manifest does not carry its dtype"
cat >"$TMP/v41.json" <<'JSON'
{"num_q_heads": 64, "kv_lora_rank": 512,
 "rope_dim": 0, "topk": 1152, "kv_cache_dtype": "KV_CACHE_DTYPE_MXFP8_DS_MLA_V41",
 "page_block_size": 64,
 "softmax_scale": 0.0625, "return_lse": true}
JSON
"$KFORGE" compile --spec "$TMP/v41.json" --arch sm_121a -o "$TMP/v41" >/dev/null ||
  fail "compile of a V4.1 spec for sm_121a failed"
[[ -s "$TMP/v41/sparse_mla_decode_h64_d512r0_topk1152_mxfp8_ds_mla_v41_pb64_sc0p0625_lse_sm121a.cubin" ]] ||
  fail "missing the V4.1 sm_121a module: $(ls "$TMP/v41")"
expect_error "--kv-dtype fp8_ds_mla_v4 on a rope-64 preset" "rope_dim: got 64" \
  manifest --preset deepseek-v3.2 --kv-dtype fp8_ds_mla_v4 --arch sm_90a

# The DSA indexer (issue 16): --kind dsa-indexer on a preset; its heads do
# not shrink with --tp; its manifest is one variant with the indexer launch,
# which the decode selector never picks.
"$KFORGE" compile --preset glm-5 --tp 8 --kind dsa-indexer --arch sm_120a -o "$TMP/ix" \
  >/dev/null || fail "compile --kind dsa-indexer failed"
[[ -s "$TMP/ix/dsa_indexer_h32_d128_topk2048_pb64_sm120a.cubin" ]] ||
  fail "missing the glm-5 indexer module: $(ls "$TMP/ix")"
grep -q '"logits_entry": "dsa_indexer_logits"' "$TMP/ix/dsa_indexer_h32_d128_topk2048_pb64_sm120a.json" ||
  fail "the indexer description has no launch"
expect_error "--kind nonsense" "--kind: got \"nonsense\"" compile --preset glm-5 --kind nonsense \
  --arch sm_90a -o "$TMP/x"
expect_error "--kind dsa-indexer --kv-dtype" "kv_cache_dtype: got fp8_ds_mla" \
  compile --preset glm-5 --kind dsa-indexer --kv-dtype fp8_ds_mla --arch sm_90a -o "$TMP/x"
"$KFORGE" manifest --preset deepseek-v3.2 --tp 8 --kind dsa-indexer --arch sm_90a \
  >"$TMP/ix_manifest.json" || fail "manifest --kind dsa-indexer failed"
grep -q '"module_name": "dsa_indexer_h64_d128_topk2048_pb64_sm90a"' "$TMP/ix_manifest.json" ||
  fail "the deepseek-v3.2 indexer manifest does not name its 64-head module"
grep -q '"topk_entry": "dsa_indexer_topk"' "$TMP/ix_manifest.json" ||
  fail "the indexer manifest has no launch"
expect_error "select --kind dsa-indexer" "dsa_indexer has no runtime selection" \
  select --preset glm-5 --kind dsa-indexer --arch sm_90a --sms 132 --batch 1 --s-q 1

# manifest / select (runtime selector, no server).
"$KFORGE" manifest --preset glm-5 --tp 8 --arch sm_90a --sms 132 >"$TMP/manifest.json" ||
  fail "kforge manifest failed"
python3 -m json.tool "$TMP/manifest.json" >/dev/null || fail "manifest is not valid JSON"
grep -q '"variants"' "$TMP/manifest.json" || fail "manifest has no variants"
sel=$("$KFORGE" select --preset glm-5 --tp 8 --arch sm_90a --sms 132 --batch 1 --s-q 1) ||
  fail "kforge select failed"
grep -q "sparse_mla_decode_h8_" <<<"$sel" || fail "select did not name the h8 module: $sel"
# The old spellings --sq and --page-size still work, with the same answer.
old=$("$KFORGE" select --preset glm-5 --tp 8 --arch sm_90a --sms 132 --batch 1 --sq 1 \
  --page-size 64) || fail "kforge select with --sq/--page-size failed"
[[ "$old" == "$sel" ]] || fail "--sq/--page-size answer differs: $old"
mtp=$("$KFORGE" select --preset glm-5 --tp 8 --arch sm_90a --sms 132 --batch 3 --s-q 2) ||
  fail "kforge select --s-q 2 failed"
grep -q "tokens *6" <<<"$mtp" || fail "select --s-q 2 --batch 3 is not 6 tokens: $mtp"
set +e
# With the device's cluster capacity, batch 1 takes the cluster entry: one
# launch, no workspace; without it (0, the default) split + combine.
cl=$("$KFORGE" select --preset glm-5 --tp 8 --arch sm_90a --sms 132 --batch 1 --clusters 7) ||
  fail "kforge select --clusters failed"
grep -q "sparse_mla_decode_cluster .*merged in the kernel" <<<"$cl" ||
  fail "select --clusters 7 did not take the cluster entry: $cl"
grep -q "workspace *0 B" <<<"$cl" || fail "the cluster entry needs a workspace: $cl"
grep -q "sparse_mla_decode_combine" <<<"$sel" || fail "select without --clusters did not combine: $sel"
if "$KFORGE" select --preset glm-5 --tp 8 --arch sm_90a --sms 132 --batch 1 --clusters -1 \
  2>/dev/null; then fail "select accepted --clusters -1"; fi
nofit=$("$KFORGE" select --preset glm-5 --tp 8 --arch sm_90a --sms 132 --batch 1 --sq 1 \
  --device-arch sm_120a 2>&1)
rc=$?
set -e
[[ $rc -eq 1 ]] || fail "select with no fitting variant exited $rc, want 1"
grep -q "missing arch sm_120a" <<<"$nofit" || fail "nothing-fits report lacks the arch: $nofit"
# A custom model through --spec: 24 heads, topk 1024.
cat >"$TMP/custom.json" <<'JSON'
{"num_q_heads": 24, "kv_lora_rank": 512,
 "rope_dim": 64, "topk": 1024, "s_q": 1, "kv_cache_dtype": "KV_CACHE_DTYPE_BF16",
 "page_block_size": 64, "softmax_scale": 0.1, "return_lse": true}
JSON
sel=$("$KFORGE" select --spec "$TMP/custom.json" --arch sm_90a --sms 132 --batch 4) ||
  fail "kforge select --spec failed"
grep -q "sparse_mla_decode_h24_d512r64_topk1024_" <<<"$sel" || fail "select --spec: $sel"
"$KFORGE" manifest --spec "$TMP/custom.json" --arch sm_120a >"$TMP/custom_manifest.json" ||
  fail "kforge manifest --spec failed"
grep -q '"num_q_heads": 24' "$TMP/custom_manifest.json" ||
  fail "manifest --spec does not describe the custom model"
# The same model as a KernelSpec (the spec file form since KernelSpec; the
# flat form above is converted): the same kernel.
cat >"$TMP/custom_nested.txtpb" <<'TXT'
sparse_mla_decode {
  num_q_heads: 24 kv_lora_rank: 512 rope_dim: 64 topk: 1024 s_q: 1
  kv_cache_dtype: bf16 page_block_size: 64 softmax_scale: 0.1 return_lse: true
}
TXT
nested=$("$KFORGE" select --spec "$TMP/custom_nested.txtpb" --arch sm_90a --sms 132 --batch 4) ||
  fail "kforge select --spec (KernelSpec form) failed"
[[ "$nested" == "$sel" ]] || fail "KernelSpec form selects differently: $nested vs $sel"

# --- special files ---------------------------------------------------------
# A FIFO, a device or a link to one is refused from its type, at once: --spec
# on a FIFO hung, on /dev/zero it aborted with std::bad_alloc, and so did
# verify on a checksums.sha256 or kforge-bundle.json linked to /dev/zero.
# `timeout` turns a hang into a failure.
expect_error_within() {
  local what=$1 needle=$2
  shift 2
  local out rc=0
  out=$(timeout 20 "$KFORGE" "$@" 2>&1) || rc=$?
  if [[ $rc -eq 124 ]]; then
    fail "$what: still running after 20 s"
  elif [[ $rc -eq 0 || $rc -gt 2 ]]; then
    fail "$what: exit $rc, expected 1 or 2 (output: $out)"
  elif ! grep -qiF -- "$needle" <<<"$out"; then
    fail "$what: exit $rc but the message does not mention '$needle': $out"
  else
    echo "ok: $what (exit $rc): $(head -n1 <<<"$out")"
  fi
}
mkfifo "$TMP/spec.fifo"
expect_error_within "--spec on a FIFO" "is a FIFO, expected a regular file" \
  compile --spec "$TMP/spec.fifo" --arch sm_90a -o "$TMP/bad"
expect_error_within "--spec on /dev/zero" "is a character device" \
  compile --spec /dev/zero --arch sm_90a -o "$TMP/bad"
head -c 2000000 /dev/zero | tr '\0' ' ' >"$TMP/big_spec.json"
expect_error_within "a 2 MB spec" "more than the 1048576 bytes" \
  compile --spec "$TMP/big_spec.json" --arch sm_90a -o "$TMP/bad"
expect_error_within "a matrix on /dev/zero" "is a character device" \
  prebuild /dev/zero --out "$TMP/bad_bundle"
echo '{"models": [{"preset": "glm-5", "tp": [8]}], "archs": ["sm_90a"]}' >"$TMP/one.json"
"$KFORGE" prebuild "$TMP/one.json" --out "$TMP/bundle" >/dev/null 2>&1 || fail "prebuild of one kernel failed"
"$KFORGE" verify "$TMP/bundle" >/dev/null 2>&1 || fail "verify of a fresh bundle failed"
for f in checksums.sha256 kforge-bundle.json; do
  cp -a "$TMP/bundle" "$TMP/zero_bundle"
  ln -sf /dev/zero "$TMP/zero_bundle/$f"
  expect_error_within "verify with $f linked to /dev/zero" "$f: is a symbolic link" \
    verify "$TMP/zero_bundle"
  expect_error_within "serve --warm-from with $f linked to /dev/zero" "$f: is a symbolic link" \
    serve --listen 127.0.0.1:0 --cache-dir "$TMP/zero_cache" --warm-from "$TMP/zero_bundle"
  rm -rf "$TMP/zero_bundle"
done

# --- bundles: one set of checks for verify and serve --warm-from -------------
# A manifests/ directory linked out of the bundle was loaded by --warm-from
# without a word; verify named a linked entry by its target.
cp -a "$TMP/bundle" "$TMP/linked_bundle"
mv "$TMP/linked_bundle/manifests" "$TMP/outside_manifests"
ln -s "$TMP/outside_manifests" "$TMP/linked_bundle/manifests"
expect_error_within "verify with manifests/ linked out of the bundle" "manifests" \
  verify "$TMP/linked_bundle"
expect_error_within "serve --warm-from with manifests/ linked out of the bundle" \
  "manifests is not a directory of the bundle (a symbolic link)" \
  serve --listen 127.0.0.1:0 --cache-dir "$TMP/linked_cache" --warm-from "$TMP/linked_bundle"
rm -rf "$TMP/linked_bundle"
cp -a "$TMP/bundle" "$TMP/linked_bundle"
ln -s ../../../../../../../../etc/passwd "$TMP/linked_bundle/manifests/evil.json"
out=$("$KFORGE" verify "$TMP/linked_bundle" 2>&1) && fail "verify accepted a linked manifest: $out"
grep -qF "manifests/evil.json" <<<"$out" || fail "verify does not name the linked entry by its path: $out"
grep -qF "etc/passwd" <<<"$out" && fail "verify names the linked entry by its target: $out"
echo "ok: verify names a linked entry by its path"
rm -rf "$TMP/linked_bundle"
# A manifest listed under a name that is not its own is refused by both.
cp -a "$TMP/bundle" "$TMP/renamed_bundle"
first=$(cd "$TMP/renamed_bundle" && ls manifests | head -n1)
cp "$TMP/renamed_bundle/manifests/$first" "$TMP/renamed_bundle/manifests/other.json"
(cd "$TMP/renamed_bundle" && sha256sum manifests/other.json >>checksums.sha256)
expect_error_within "verify with a manifest under another name" "manifests/other.json" \
  verify "$TMP/renamed_bundle"
expect_error_within "serve --warm-from with a manifest under another name" \
  "holds the manifest of manifests/$first" \
  serve --listen 127.0.0.1:0 --cache-dir "$TMP/renamed_cache" --warm-from "$TMP/renamed_bundle"
rm -rf "$TMP/renamed_bundle"

# A 1.5 GB unlisted file (sparse here) is refused from its size, not read.
cp -a "$TMP/bundle" "$TMP/big_bundle"
truncate -s 1500M "$TMP/big_bundle/kernels/huge.kfa"
expect_error_within "verify with a 1.5 GB unlisted kernel file" "more than the 268435456 bytes" \
  verify "$TMP/big_bundle"
# --warm-from ignored it (and an unlisted link) without a word (issue 43).
expect_error_within "serve --warm-from with a 1.5 GB unlisted kernel file" \
  "1 file is not listed in checksums.sha256 (kernels/huge.kfa)" \
  serve --listen 127.0.0.1:0 --cache-dir "$TMP/big_cache" --warm-from "$TMP/big_bundle"
rm -rf "$TMP/big_bundle"

# --- duplicate keys ----------------------------------------------------------
printf '{"num_q_heads": 16, "kv_lora_rank": 512,\n "rope_dim": 64, "topk": 2048, "topk": 1024, "kv_cache_dtype": "KV_CACHE_DTYPE_BF16",\n "page_block_size": 64, "softmax_scale": 0.1}\n' >"$TMP/dup.json"
expect_error "duplicate key in a JSON spec" 'line 2: key "topk" is given twice' \
  compile --spec "$TMP/dup.json" --arch sm_90a -o "$TMP/bad"
# --tp beyond uint32 and a softmax_scale that overflows the kernel's constant.
expect_error "--tp 4294967295" "tensor_parallel: got 4294967295" \
  manifest --preset glm-5 --tp 4294967295 --arch sm_90a
sed 's/"softmax_scale": 0.1/"softmax_scale": 3e38/; s/"topk": 1024, //' "$TMP/dup.json" >"$TMP/huge_scale.json"
expect_error "softmax_scale 3e38" "softmax_scale: got 3e+38" \
  compile --spec "$TMP/huge_scale.json" --arch sm_90a -o "$TMP/bad"

# --- transport security: TLS, mTLS, bearer tokens (real processes) ----------
# Certificates and keys are made here, with the openssl CLI, every run.
command -v openssl >/dev/null || { echo "cli_test: the openssl CLI is missing (scripts/install_deps.sh)" >&2; exit 1; }
PKI=$TMP/pki
mkdir -p "$PKI"
make_ca() { # NAME
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj "/CN=kforge test $1" -keyout "$PKI/$1.key" -out "$PKI/$1.pem" 2>/dev/null
}
make_cert() { # NAME CA SAN
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$1" \
    -keyout "$PKI/$1.key" -out "$PKI/$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\n' "$3" >"$PKI/$1.ext"
  openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/$2.pem" -CAkey "$PKI/$2.key" -CAcreateserial \
    -days 1 -extfile "$PKI/$1.ext" -out "$PKI/$1.pem" 2>/dev/null
}
make_ca ca
make_ca other_ca
make_cert server ca "IP:127.0.0.1,DNS:localhost"
make_cert client ca "DNS:kforge-client"
make_cert stranger other_ca "DNS:kforge-stranger"
[[ -s "$PKI/server.pem" && -s "$PKI/client.pem" ]] || { echo "cli_test: openssl made no certificates" >&2; exit 1; }

SERVER_PID=
SERVER_LOG=
ADDR=
# start_server NAME serve-args...: waits for "serving on" and sets ADDR.
start_server() {
  local name=$1
  shift
  SERVER_LOG=$TMP/$name.log
  # Created here: the background job opens it for itself, maybe after the
  # first read below.
  : >"$SERVER_LOG"
  "$KFORGE" serve --listen 127.0.0.1:0 --cache-dir "$TMP/sec_cache" --workers 1 "$@" \
    >"$SERVER_LOG" 2>&1 &
  SERVER_PID=$!
  ADDR=
  for _ in $(seq 300); do
    ADDR=$(sed -n 's/^kforge: serving on \([^ ]*\).*/\1/p' "$SERVER_LOG")
    [[ -n "$ADDR" ]] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  fail "$name: server did not start: $(cat "$SERVER_LOG")"
  return 1
}
stop_server() {
  [[ -n "$SERVER_PID" ]] || return 0
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}
trap 'stop_server; rm -rf "$TMP"' EXIT
# expect_ok "what" kforge-args...
expect_ok() {
  local what=$1
  shift
  local out rc=0
  out=$(timeout 60 "$KFORGE" "$@" 2>&1) || rc=$?
  if [[ $rc -ne 0 ]]; then
    fail "$what: exit $rc: $out"
  else
    echo "ok: $what"
  fi
}
# health NAME ROOTS_PEM: a stock gRPC health check with no token and no
# client certificate; prints the serving status number (1 = SERVING).
health() {
  "${KFORGE_TEST_PYTHON:-/usr/bin/python3}" - "$ADDR" "$1" <<'PY'
import sys, grpc
addr, ca = sys.argv[1], sys.argv[2]
creds = grpc.ssl_channel_credentials(root_certificates=open(ca, "rb").read())
with grpc.secure_channel(addr, creds) as ch:
    check = ch.unary_unary("/grpc.health.v1.Health/Check")
    answer = check(b"", timeout=10)
    print(answer[1] if len(answer) >= 2 else 0)
PY
}

# TLS: a TLS client works; a plain-text client is told the server serves TLS.
start_server tls --tls-cert "$PKI/server.pem" --tls-key "$PKI/server.key"
grep -q "(TLS" "$SERVER_LOG" || fail "TLS server does not say it serves TLS: $(cat "$SERVER_LOG")"
expect_ok "stats over TLS" stats --server "$ADDR" --tls-ca "$PKI/ca.pem"
expect_error "plain-text stats against a TLS server" "probably serves TLS" stats --server "$ADDR"
expect_error "TLS stats with another CA" "TLS handshake failed" \
  stats --server "$ADDR" --tls-ca "$PKI/other_ca.pem"
expect_error "warm in plain text against a TLS server" "--tls-ca" \
  warm --server "$ADDR" --connect-timeout 3 "$TMP/one.json"
expect_ok "get over TLS" get --server "$ADDR" --tls-ca "$PKI/ca.pem" --preset glm-5 --tp 8 \
  --arch sm_90a -o "$TMP/tls_get"
ls "$TMP/tls_get"/*.cubin >/dev/null 2>&1 || fail "get over TLS wrote no cubin"
stop_server

# Rotation: SIGHUP rereads the certificate, key and client CA; new
# connections get the new certificate within a second (gRPC rereads the
# published copy every second), and a rotated pair that does not match is
# refused with the old one kept.
ROT=$TMP/rotate
mkdir -p "$ROT/tmp"
cp "$PKI/server.pem" "$ROT/server.pem"
cp "$PKI/server.key" "$ROT/server.key"
cp "$PKI/ca.pem" "$ROT/client_ca.pem"
TMPDIR=$ROT/tmp start_server rotate --tls-cert "$ROT/server.pem" --tls-key "$ROT/server.key" \
  --tls-client-ca "$ROT/client_ca.pem"
[[ "$(stat -c %a "$ROT"/tmp/kforge-tls-*)" == 700 ]] ||
  fail "the TLS copies are not in a private directory: $(ls -la "$ROT/tmp")"
MTLS_OLD=(--server "$ADDR" --tls-cert "$PKI/client.pem" --tls-key "$PKI/client.key")
MTLS_NEW=(--server "$ADDR" --tls-cert "$PKI/stranger.pem" --tls-key "$PKI/stranger.key")
expect_ok "mTLS before the rotation" stats "${MTLS_OLD[@]}" --tls-ca "$PKI/ca.pem"
make_cert server2 other_ca "IP:127.0.0.1,DNS:localhost"
cp "$PKI/server2.key" "$ROT/server.key" # the key first: a half-done rotation
kill -HUP "$SERVER_PID"
for _ in $(seq 100); do grep -q "TLS files not reloaded" "$SERVER_LOG" && break; sleep 0.1; done
grep -q "TLS files not reloaded.*not the certificate's key" "$SERVER_LOG" ||
  fail "a key that does not match its certificate is not refused: $(cat "$SERVER_LOG")"
expect_ok "the old certificate after a refused rotation" stats "${MTLS_OLD[@]}" --tls-ca "$PKI/ca.pem"
cp "$PKI/server2.pem" "$ROT/server.pem"
cp "$PKI/other_ca.pem" "$ROT/client_ca.pem"
kill -HUP "$SERVER_PID"
for _ in $(seq 100); do grep -q "TLS files reloaded" "$SERVER_LOG" && break; sleep 0.1; done
grep -q "TLS files reloaded" "$SERVER_LOG" || fail "no TLS reload after SIGHUP: $(cat "$SERVER_LOG")"
rotated=0
for _ in $(seq 50); do
  if timeout 60 "$KFORGE" stats "${MTLS_NEW[@]}" --tls-ca "$PKI/other_ca.pem" >/dev/null 2>&1; then
    rotated=1
    break
  fi
  sleep 0.2
done
[[ $rotated -eq 1 ]] && echo "ok: a client trusting only the new CA, with a certificate from it" ||
  fail "the rotated certificate and client CA are not served within 10 s: $(cat "$SERVER_LOG")"
expect_error "a client trusting only the old CA after the rotation" "TLS handshake failed" \
  stats "${MTLS_OLD[@]}" --tls-ca "$PKI/ca.pem"
expect_error "a client certificate from the old client CA after the rotation" "UNAVAILABLE" \
  stats --server "$ADDR" --tls-ca "$PKI/other_ca.pem" --tls-cert "$PKI/client.pem" \
  --tls-key "$PKI/client.key"
stop_server
# The published copies live in a private directory, gone at exit.
[[ -z "$(ls -A "$ROT/tmp")" ]] || fail "the server left its TLS copies: $(ls -lR "$ROT/tmp")"

# mTLS: a client certificate from the client CA is required.
start_server mtls --tls-cert "$PKI/server.pem" --tls-key "$PKI/server.key" \
  --tls-client-ca "$PKI/ca.pem"
expect_ok "stats with a client certificate" stats --server "$ADDR" --tls-ca "$PKI/ca.pem" \
  --tls-cert "$PKI/client.pem" --tls-key "$PKI/client.key"
expect_error "mTLS stats without a client certificate" "UNAVAILABLE" \
  stats --server "$ADDR" --tls-ca "$PKI/ca.pem"
expect_error "mTLS stats with another CA's certificate" "UNAVAILABLE" \
  stats --server "$ADDR" --tls-ca "$PKI/ca.pem" --tls-cert "$PKI/stranger.pem" \
  --tls-key "$PKI/stranger.key"
stop_server

# Tokens: missing or wrong -> UNAUTHENTICATED; health stays open; Warm needs
# the admin token; SIGHUP rereads the files.
USER_TOKEN=user-$(openssl rand -hex 16)
ADMIN_TOKEN=admin-$(openssl rand -hex 16)
NEW_TOKEN=new-$(openssl rand -hex 16)
printf '# users\n%s\n' "$USER_TOKEN" >"$TMP/tokens"
printf '%s\n' "$ADMIN_TOKEN" >"$TMP/admin_tokens"
printf '%s\n' "$USER_TOKEN" >"$TMP/user.token"
printf '%s\n' "$ADMIN_TOKEN" >"$TMP/admin.token"
printf 'wrong-%s\n' "$USER_TOKEN" >"$TMP/wrong.token"
# kforge serve refuses token files that others can read.
chmod 600 "$TMP/tokens" "$TMP/admin_tokens"
start_server tokens --tls-cert "$PKI/server.pem" --tls-key "$PKI/server.key" \
  --auth-token-file "$TMP/tokens" --admin-token-file "$TMP/admin_tokens"
TLS=(--server "$ADDR" --tls-ca "$PKI/ca.pem")
expect_error "stats without a token" "UNAUTHENTICATED" stats "${TLS[@]}"
expect_error "stats with a wrong token" "UNAUTHENTICATED" stats "${TLS[@]}" \
  --token-file "$TMP/wrong.token"
expect_ok "stats with a token file" stats "${TLS[@]}" --token-file "$TMP/user.token"
out=$(KFORGE_TOKEN=$USER_TOKEN "$KFORGE" stats "${TLS[@]}" 2>&1) &&
  echo "ok: stats with KFORGE_TOKEN" || fail "stats with KFORGE_TOKEN: $out"
out=$(KFORGE_TOKEN=wrong-$USER_TOKEN "$KFORGE" stats "${TLS[@]}" 2>&1) &&
  fail "stats with a wrong KFORGE_TOKEN succeeded" || grep -q UNAUTHENTICATED <<<"$out" ||
  fail "wrong KFORGE_TOKEN: $out"
[[ "$(health "$PKI/ca.pem")" == 1 ]] && echo "ok: health is open without a token" ||
  fail "health check without a token did not answer SERVING"
expect_error "a token in plain text" "only sent over TLS" stats --server "$ADDR" \
  --token-file "$TMP/user.token"
out=$("$KFORGE" warm "${TLS[@]}" --token-file "$TMP/user.token" "$TMP/one.json" 2>&1) &&
  fail "warm with a user token succeeded: $out"
grep -q "admin token" <<<"$out" && echo "ok: warm with a user token is refused" ||
  fail "warm with a user token: $out"
expect_ok "warm with the admin token" warm "${TLS[@]}" --token-file "$TMP/admin.token" \
  "$TMP/one.json"
expect_ok "stats with the admin token" stats "${TLS[@]}" --token-file "$TMP/admin.token"
printf '%s\n' "$NEW_TOKEN" >"$TMP/tokens"
printf '%s\n' "$NEW_TOKEN" >"$TMP/new.token"
kill -HUP "$SERVER_PID"
for _ in $(seq 100); do grep -q "tokens reloaded" "$SERVER_LOG" && break; sleep 0.1; done
grep -q "tokens reloaded (1 user, 1 admin)" "$SERVER_LOG" || fail "no reload after SIGHUP: $(cat "$SERVER_LOG")"
expect_error "the old token after SIGHUP" "UNAUTHENTICATED" stats "${TLS[@]}" \
  --token-file "$TMP/user.token"
expect_ok "the new token after SIGHUP" stats "${TLS[@]}" --token-file "$TMP/new.token"
# A token file that became bad keeps the tokens in use.
printf 'short\n' >"$TMP/tokens"
kill -HUP "$SERVER_PID"
for _ in $(seq 100); do grep -q "tokens not reloaded" "$SERVER_LOG" && break; sleep 0.1; done
grep -q "tokens not reloaded.*--auth-token-file" "$SERVER_LOG" ||
  fail "a bad token file on SIGHUP is not reported: $(cat "$SERVER_LOG")"
expect_ok "the new token after a failed reload" stats "${TLS[@]}" --token-file "$TMP/new.token"
stop_server

# Refused at start, with the flag named; a warning off loopback without TLS.
expect_error_within "tokens without TLS" "need --tls-cert" \
  serve --listen 127.0.0.1:0 --cache-dir "$TMP/sec_cache" --auth-token-file "$TMP/new.token"
expect_error_within "--tls-cert without --tls-key" "--tls-key" \
  serve --listen 127.0.0.1:0 --cache-dir "$TMP/sec_cache" --tls-cert "$PKI/server.pem"
expect_error_within "--tls-key on a FIFO" "--tls-key" \
  serve --listen 127.0.0.1:0 --cache-dir "$TMP/sec_cache" --tls-cert "$PKI/server.pem" \
  --tls-key "$TMP/spec.fifo"
start_server wide --listen 0.0.0.0:0
grep -q "warning: serving on 0.0.0.0:0 without TLS" "$SERVER_LOG" &&
  echo "ok: a warning when serving off loopback without TLS" ||
  fail "no warning for 0.0.0.0 without TLS: $(cat "$SERVER_LOG")"
stop_server
start_server local
grep -q "warning" "$SERVER_LOG" && fail "a warning on loopback: $(cat "$SERVER_LOG")"
stop_server

# --- signed bundles -----------------------------------------------------------
expect_ok "keygen" keygen --out "$TMP/signer"
[[ "$(stat -c %a "$TMP/signer.key")" == 600 ]] || fail "signer.key is not mode 600"
expect_ok "keygen of a second key" keygen --out "$TMP/other"
expect_error "keygen over an existing key" "exists" keygen --out "$TMP/signer"
cp -a "$TMP/bundle" "$TMP/signed"
expect_ok "prebuild --sign" prebuild "$TMP/one.json" --out "$TMP/signed" --sign "$TMP/signer.key"
[[ -s "$TMP/signed/checksums.sha256.sig" ]] || fail "prebuild --sign wrote no signature"
openssl pkeyutl -verify -pubin -inkey "$TMP/signer.pub" -rawin -in "$TMP/signed/checksums.sha256" \
  -sigfile "$TMP/signed/checksums.sha256.sig" >/dev/null 2>&1 &&
  echo "ok: openssl verifies the signature" || fail "openssl does not verify checksums.sha256.sig"
expect_error "prebuild --sign with a public key" "--sign" \
  prebuild "$TMP/one.json" --out "$TMP/signed" --sign "$TMP/signer.pub"
expect_ok "verify --trust of a signed bundle" verify --trust "$TMP/signer.pub" "$TMP/signed"
expect_error "verify --trust with another key" "is not a signature" \
  verify --trust "$TMP/other.pub" "$TMP/signed"
expect_error "verify --trust of an unsigned bundle" "is not signed" \
  verify --trust "$TMP/signer.pub" "$TMP/bundle"
start_server signed --warm-from "$TMP/signed" --trust "$TMP/signer.pub"
for _ in $(seq 300); do grep -q "warm-up done" "$SERVER_LOG" && break; sleep 0.1; done
grep -q "warm-up done.*1 kernels" "$SERVER_LOG" && echo "ok: serve --warm-from --trust loads a signed bundle" ||
  fail "signed bundle not loaded: $(cat "$SERVER_LOG")"
stop_server
expect_error_within "serve --trust with an unsigned bundle" "is not signed" \
  serve --listen 127.0.0.1:0 --cache-dir "$TMP/sec_cache" --warm-from "$TMP/bundle" \
  --trust "$TMP/signer.pub"
expect_error_within "serve --trust with another key" "is not a signature" \
  serve --listen 127.0.0.1:0 --cache-dir "$TMP/sec_cache" --warm-from "$TMP/signed" \
  --trust "$TMP/other.pub"
# A planted kernel with recomputed checksums: the signature no longer matches.
cp -a "$TMP/signed" "$TMP/planted"
kfa=$(cd "$TMP/planted" && ls kernels/*.kfa | head -n1)
printf 'planted' >>"$TMP/planted/$kfa"
(cd "$TMP/planted" && sha256sum kernels/*.kfa manifests/*.json | sort -k2 >checksums.sha256)
expect_error_within "serve --trust with a tampered bundle" "is not a signature" \
  serve --listen 127.0.0.1:0 --cache-dir "$TMP/planted_cache" --warm-from "$TMP/planted" \
  --trust "$TMP/signer.pub"
# Refused before the cache is opened: nothing of it reaches the disk cache.
[[ ! -e "$TMP/planted_cache" ]] || fail "a refused bundle left a cache: $(find "$TMP/planted_cache")"
# Alone, --trust refuses unsigned bundles' entries in the cache
# (PrebuildTest); its key must still be readable.
expect_error "--trust without --warm-from, with a missing key" "--trust: cannot open $TMP/missing.pub" \
  serve --listen 127.0.0.1:0 --cache-dir "$TMP/sec_cache" --trust "$TMP/missing.pub"

# --- versions, environment ------------------------------------------------
expect_ok "--version" --version
"$KFORGE" --version | grep -qx "format 5" || fail "--version does not print 'format 5'"
"$KFORGE" version --json | "${KFORGE_TEST_PYTHON:-python3}" -c '
import json, sys
d = json.load(sys.stdin)
assert d["format_version"] == 5 and "sm_90a" in d["archs"] and len(d["template_digest"]) == 64, d
' || fail "version --json is not the JSON expected"
KFORGE_WORKERS=0 expect_error "a serve flag from the environment" "--workers: got 0" \
  serve --listen 127.0.0.1:0 --cache-dir "$TMP/env_cache"
stop_server
# KFORGE_LISTEN and KFORGE_CACHE_DIR stand for the flags; KFORGE_SERVER for
# --server.
SERVER_LOG=$TMP/env_server.log
: >"$SERVER_LOG"
KFORGE_LISTEN=127.0.0.1:0 KFORGE_CACHE_DIR=$TMP/env_cache "$KFORGE" serve >"$SERVER_LOG" 2>&1 &
SERVER_PID=$!
for _ in $(seq 300); do
  ADDR=$(sed -n 's/^kforge: serving on \([^ ]*\).*/\1/p' "$SERVER_LOG")
  [[ -n "$ADDR" ]] && break
  sleep 0.1
done
grep -qF "cache $TMP/env_cache" "$SERVER_LOG" || fail "KFORGE_CACHE_DIR ignored: $(cat "$SERVER_LOG")"
KFORGE_SERVER=$ADDR expect_ok "stats from KFORGE_SERVER" stats
KFORGE_SERVER=$ADDR "$KFORGE" stats | grep -q '"compiles": 0,' || fail "stats via KFORGE_SERVER"
stop_server

# --- doctor ------------------------------------------------------------------
out=$("$KFORGE" doctor --cache-dir "$TMP/env_cache" 2>&1) || fail "doctor on a good setup: $out"
for needle in "cache: $TMP/env_cache: 0 kernels" "tls: off, plain text on 127.0.0.1:50051 (loopback only)" \
  "redis: not configured" "workers: "; do
  grep -qF "$needle" <<<"$out" || fail "doctor does not say '$needle': $out"
done
grep -qE "^(gpu: none usable|driver: CUDA)" <<<"$out" || fail "doctor says nothing of the GPU: $out"
# A shared tier needs the fleet key (docs/OPERATIONS.md, "Trust model").
KFORGE_REDIS=127.0.0.1:1 expect_error "doctor with Redis and no fleet key" \
  "redis: a shared Redis tier needs a fleet key" doctor --cache-dir "$TMP/env_cache"
printf '%s\n' 0123456789abcdef0123456789abcdef0123456789abcdef >"$TMP/fleet.key"
KFORGE_REDIS=127.0.0.1:1 KFORGE_FLEET_KEY="$TMP/fleet.key" expect_error \
  "doctor with an unreachable Redis" "redis: redis 127.0.0.1:1 is not reachable" \
  doctor --cache-dir "$TMP/env_cache" --redis-timeout 200ms
expect_error "doctor with a missing TLS key" "tls: --tls-key" \
  doctor --cache-dir "$TMP/env_cache" --tls-cert "$PKI/server.pem" --tls-key "$TMP/no.key"

# --- structured logs -----------------------------------------------------------
expect_error "serve --log-format xml" "expected text or json" serve --log-format xml
JSON_LOG=$TMP/json_serve.log
"$KFORGE" serve --listen 127.0.0.1:0 --cache-dir "$TMP/json_cache" --workers 1 \
  --log-format json >"$JSON_LOG" 2>&1 &
JSON_PID=$!
ADDR=
for _ in $(seq 300); do
  ADDR=$(sed -n 's/.*"event":"start".*"address":"\([^"]*\)".*/\1/p' "$JSON_LOG")
  [[ -n "$ADDR" ]] && break
  sleep 0.1
done
[[ -n "$ADDR" ]] || fail "serve --log-format json: no start event: $(cat "$JSON_LOG")"
expect_ok "get from a JSON-logging server" get --server "$ADDR" --preset glm-5 --tp 8 \
  --arch sm_80 -o "$TMP/json_get"
# The DSA indexer through a server: manifest, kernel, artifact check.
expect_ok "get --kind dsa-indexer from a server" get --server "$ADDR" --preset glm-5 --tp 8 \
  --kind dsa-indexer --arch sm_80 -o "$TMP/json_get_ix"
[[ -s "$TMP/json_get_ix/dsa_indexer_h32_d128_topk2048_pb64_sm80.cubin" ]] ||
  fail "get --kind dsa-indexer wrote no module: $(ls "$TMP/json_get_ix")"
kill -TERM "$JSON_PID"
wait "$JSON_PID" || fail "serve --log-format json exited non-zero"
# Every line one JSON object with ts, level and event; the compile says
# which kernel and how long; start, shutdown and stop are there.
"${KFORGE_TEST_PYTHON:-/usr/bin/python3}" - "$JSON_LOG" <<'PY' || fail "JSON log: $(cat "$JSON_LOG")"
import json, re, sys
events = []
for line in open(sys.argv[1]):
    e = json.loads(line)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e["ts"]), e
    assert e["level"] in ("info", "warning", "error"), e
    events.append(e)
names = [e["event"] for e in events]
for want in ("start", "compile", "shutdown", "stop"):
    assert want in names, (want, names)
compile = next(e for e in events if e["event"] == "compile")
assert re.fullmatch(r"[0-9a-f]{64}", compile["key"]), compile
assert compile["module"].startswith("sparse_mla_decode_h8_"), compile
assert isinstance(compile["duration_s"], (int, float)) and compile["duration_s"] > 0, compile
assert compile["source"] == "compile", compile
PY
echo "ok: serve --log-format json writes one event object per line"

if [[ $FAILED -ne 0 ]]; then
  echo "cli_test: FAILED" >&2
  exit 1
fi
echo "cli_test: all checks passed"
