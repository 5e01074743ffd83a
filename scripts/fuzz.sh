#!/usr/bin/env bash
# Builds the wire-decoder fuzz target with clang + libFuzzer + ASan/UBSan and
# runs it for SECONDS (default 60) on test/fuzz/corpus/wire, adding what it
# finds to that corpus (which the test suite replays in CI).
# Needs clang-16 and libclang-rt-16-dev (apt-get install clang-16 libclang-rt-16-dev).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
out="$root/build-fuzz"
corpus="$root/test/fuzz/corpus/wire"
cxx=${FUZZ_CXX:-clang++-16}
command -v "$cxx" >/dev/null || { echo "fuzz: $cxx not found; apt-get install clang-16 libclang-rt-16-dev" >&2; exit 2; }
mkdir -p "$out/gen" "$corpus"
capnp compile -oc++:"$out/gen" --src-prefix="$root/transports/wire" "$root/transports/wire/troupe.capnp"
flags=(-std=c++2b -O1 -g -fsanitize=fuzzer,address,undefined -I"$root/base/include" -I"$root/transports/src" -I"$root/test/fuzz" -I"$out/gen")
# Cap'n Proto 0.9's headers only build as C++17 under clang: its files are compiled apart.
capnp_flags=("${flags[@]/-std=c++2b/-std=c++17}")
"$cxx" "${capnp_flags[@]}" -w -c "$out/gen/troupe.capnp.c++" -o "$out/troupe.capnp.o"
"$cxx" "${capnp_flags[@]}" -c "$root/transports/src/wire_capnp.cc" -o "$out/wire_capnp.o"
"$cxx" "${flags[@]}" "$root/test/fuzz/wire_fuzz.cc" "$root/transports/src/wire.cc" "$root/base/src/status.cc" "$out/wire_capnp.o" \
  "$out/troupe.capnp.o" -lcapnp -lkj -o "$out/wire_fuzz"
if [[ -z $(ls -A "$corpus") ]]; then
  TROUPE_WRITE_SEEDS="$corpus" "$out/wire_fuzz" -runs=0 "$corpus"
fi
mkdir -p "$out/new"
"$out/wire_fuzz" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 "$out/new" "$corpus" 2>&1 | tail -15
# Keep the corpus small: merge what was found into a minimal set.
"$out/wire_fuzz" -merge=1 "$corpus" "$out/new" 2>&1 | tail -1
rm -rf "$out/new"
echo "fuzz: corpus has $(ls "$corpus" | wc -l) inputs"
