#!/bin/bash
# Shared helper of serve.sh and eval.sh: rebuild the SmolLM2 GGUF on the device from parts carried over
# two calls (one call may carry at most 64 MiB; the file is 94 MiB). Made here with:
#   mkdir -p .gguf && split -b 49181216 -a 2 FILE.gguf .gguf/part- && (sha256sum < FILE.gguf | ...) > .gguf/SHA256
# .gguf/SHA256 holds "<sha256>  <original file name>". NOTE (seen on the device): a call
# that carries .gguf/part-ab replaces the whole .gguf folder there, so part-aa must be parked outside
# the repo in call 1 and put back in call 2 (the machine must stay warm: <= 30 s between the calls):
#   call 1, carry [.gguf/part-aa, .gguf/SHA256]:  mkdir -p /tmp/gg && cp .gguf/part-aa .gguf/SHA256 /tmp/gg/
#   call 2, carry [.gguf/part-ab, .gguf/SHA256]:  cp /tmp/gg/part-aa .gguf/ &&
#     G=$(bash benchmarks/device/gguf.sh)
# Usage: bash benchmarks/device/gguf.sh [PARTS_DIR=.gguf] [DEST_DIR=/tmp/smollm2]
# Prints the joined file's path as the only stdout line; exits non-zero with a message otherwise.
set -o pipefail
parts_dir=${1:-.gguf}
dest_dir=${2:-/tmp/smollm2}

die() {
    echo "benchmarks/device/gguf.sh: $*" >&2
    exit 1
}

[ -s "$parts_dir/SHA256" ] || die "$parts_dir/SHA256 is missing (carry it with part-aa in call 1)"
read -r want name <"$parts_dir/SHA256"
[ -n "$want" ] && [ -n "$name" ] || die "$parts_dir/SHA256 must read '<sha256>  <file name>'"
for part in aa ab; do
    # Both parts are needed; a missing one means the machine went cold between the calls.
    [ -s "$parts_dir/part-$part" ] || die "$parts_dir/part-$part is missing: carry .gguf/part-aa in call 1, \
.gguf/part-ab in call 2, with at most ~30 s between them (a cold machine loses part-aa: redo both calls)"
done

target="$dest_dir/$name"
mkdir -p "$dest_dir" || die "cannot create $dest_dir"
if [ -s "$target" ] && [ "$(sha256sum <"$target" | cut -d' ' -f1)" = "$want" ]; then
    echo "$target"  # already joined by an earlier run
    exit 0
fi
cat "$parts_dir"/part-a? >"$target.tmp" || die "cannot write $target.tmp"
got=$(sha256sum <"$target.tmp" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
    rm -f "$target.tmp"
    die "sha256 mismatch for $name: got $got, want $want (a part is truncated or stale)"
fi
mv "$target.tmp" "$target" || die "cannot move $target.tmp to $target"
echo "$target"
