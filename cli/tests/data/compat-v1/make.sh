#!/usr/bin/env bash
# Makes the compatibility fixture of this directory: a state directory (with its private swtpm's
# state under state/swtpm) written by tpm-vault at commit 0861f1c (0.1.0, before issues #18 and
# #20 change the daemon's insides and add stream format v2), with keys of every algorithm, a
# sealed secret, a data key and a v1 stream, plus what a later release must get back from them.
# `cli/tests/compat.rs` opens a copy with the current code on every test run. Do not re-run
# this to "update" the fixture: it must stay what the old code wrote.
#
# Usage: client/tests/data/compat-v1/make.sh DAEMON_BIN CLI_BIN
set -euo pipefail
daemon=$1 cli=$2
out=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/policies"
printf '[[rule]]\nname = "all"\nclients = ["uid:%s"]\nkeys = ["*"]\noperations = ["*"]\n' "$(id -u)" > "$work/policies/all.toml"
TSS2_LOG=all+NONE "$daemon" --simulator --state-dir "$work/state" --socket "$work/vault.sock" \
    --policies "$work/policies" 2>"$work/daemon.log" &
pid=$!
for _ in $(seq 100); do [ -S "$work/vault.sock" ] && break; sleep 0.1; done
v() { "$cli" --socket "$work/vault.sock" "$@"; }
rm -rf "$out/state" "$out/expected"
mkdir -p "$out/expected"
for alg in ecc-p256 ecc-p384 rsa-2048 rsa-3072 ml-dsa-44 ml-dsa-65 ml-dsa-87 ml-kem-768 ml-kem-1024 hybrid-p256-mldsa65; do
    v key create "k-$alg" --alg "$alg" >/dev/null
    v key public "k-$alg" > "$out/expected/k-$alg.pub.pem"
done
TPM_VAULT_KEY_AUTH=old-password v key create k-auth --alg ecc-p256 --auth >/dev/null
v key public k-auth > "$out/expected/k-auth.pub.pem"
v key create k-pcr --alg ecc-p256 --pcr sha256:9 >/dev/null
v key public k-pcr > "$out/expected/k-pcr.pub.pem"
v cert self-sign k-ecc-p256 --subject CN=compat --san dns:compat > "$out/expected/k-ecc-p256.chain.pem"
v kem encap k-ml-kem-768 --out "$out/expected/kem.ct" | sed -n "s/^shared secret: //p" > "$out/expected/kem.secret.hex"
head -c 100000 /dev/urandom > "$out/expected/secret.bin"
v seal s-pcr9 < "$out/expected/secret.bin" >/dev/null
head -c 200000 /dev/urandom > "$out/expected/plain.bin"
v datakey create d-backup >/dev/null
v encrypt d-backup --context compat-v1 < "$out/expected/plain.bin" > "$out/expected/stream-v1.sealed"
kill "$pid"; wait "$pid" 2>/dev/null || true
cp -a "$work/state" "$out/state"
rm -f "$out/state/vault.sock"
find "$out/state" -name '*.pid' -delete
echo "fixture written to $out"
