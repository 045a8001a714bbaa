#!/usr/bin/env bash
# Here (CPU machine): build the wheel bundle that puts SGLang 0.5.15 on the GPU machine's image (python 3.12,
# torch 2.11.0+cu130, which sglang 0.5.15 pins), split into parts that each fit one device call's carry beside
# the working tree. Then benchmarks/gpu/sglang_h200.sh runs there. Issue #18.
#
# usage: bash benchmarks/gpu/prepare_sglang_h200.sh [OUTDIR]     (from the repository root; OUTDIR default .whl-sgl)
#   The folder must be ignored by git, or the device call would send it with the working tree; this script adds
#   /.whl-sgl/ to "$(git rev-parse --git-common-dir)/info/exclude" (the exclude file every worktree of this
#   repository shares), as you would by hand:
#       echo /.whl-sgl/ >> "$(git rev-parse --git-common-dir)/info/exclude"
# env: CHUNK (default 30M: a call carries the working tree, 27 MiB on 2026-12-07, plus one part, under the 64 MiB limit),
#      DEPS (default benchmarks/gpu/sglang_deps.txt: NAME==VERSION lines, what the image lacks and why),
#      SLIM=1 (default) drops from sglang-kernel what the Triton attention backend does not use (FA3's flash_ops,
#      FlashMLA, the sm100 build: 587 -> ~12 MiB); SLIM=0 keeps the wheel whole (then pass
#      --option attention_backend=fa3 if you want SGLang's Hopper default, and expect ~17 carry parts).
# result: OUTDIR/p1 .. OUTDIR/pN; the last part also holds SHA256SUMS and device-install.sh
#   (benchmarks/gpu/sglang_device_install.sh). Carry one part per device call, back to back (the machine stays warm
#   30 s); the last call runs `source .whl-sgl/pN/device-install.sh` (the commands: benchmarks/gpu/sglang_h200.sh).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
OUT=${1:-.whl-sgl}
HERE=benchmarks/gpu
DEPS=${DEPS:-$HERE/sglang_deps.txt}
SLIM=${SLIM:-1}
CHUNK=${CHUNK:-30M}
EXCLUDE="$(git rev-parse --git-common-dir)/info/exclude"
case "$OUT" in
  /*|../*) ;;  # outside the checkout: nothing to exclude
  *) mkdir -p "$(dirname "$EXCLUDE")"; grep -qxF "/${OUT%/}/" "$EXCLUDE" 2>/dev/null || echo "/${OUT%/}/" >> "$EXCLUDE" ;;
esac
if [ -z "$(git check-ignore "$OUT/p1" 2>/dev/null)" ] && [ "${OUT#/}" = "$OUT" ]; then
  echo "$OUT is not ignored by git: it would travel with the working tree" >&2; exit 1
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PLAT=""
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64; do
  PLAT="$PLAT --platform $p"
done
PY=${PYTHON:-python3}
dl() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT \
         -d "$WORK/w" "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
mkdir -p "$WORK/w"
grep -v '^\s*#' "$DEPS" | sed 's/#.*//; s/\s//g' | grep . > "$WORK/deps" || true
dl -r "$WORK/deps"
# one wheel per line of the list, one version each (two versions of a package stop the install)
missing=0
while read -r spec; do
  name=$(echo "${spec%%==*}" | tr 'A-Z-' 'a-z_'); ver=${spec#*==}
  n=$(ls "$WORK/w" | awk -F- '{print tolower($1) "-" $2}' | grep -cxF "${name}-${ver}" || true)
  [ "$n" = 1 ] || { echo "missing or duplicated wheel for $spec ($n found)" >&2; missing=1; }
done < "$WORK/deps"
[ "$missing" = 0 ] || exit 1
if [ "$SLIM" = 1 ]; then
  "$PY" - "$(ls "$WORK"/w/sglang_kernel-0.4.4-*.whl)" <<'PY'
import os, sys, zipfile
src = sys.argv[1]; tmp = src + ".tmp"
# FA3 (flash_ops: the fa3 attention backend), FlashMLA (MLA models), the sm100 build (Blackwell; H100/H200 are
# sm90 and load sgl_kernel/sm90/common_ops). sgl_kernel/__init__ imports none of them.
drop = lambda f: f in ("sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so") or f.startswith("sgl_kernel/sm100/")
kept = dropped = 0
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zo:
    for info in zi.infolist():
        if drop(info.filename):
            dropped += info.file_size
            continue
        data = zi.read(info.filename)
        if info.filename.endswith(".dist-info/RECORD"):  # keep the wheel installable: RECORD must match its files
            data = b"".join(l for l in data.splitlines(True) if not drop(l.split(b",")[0].decode()))
        zo.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
        kept += info.file_size
os.replace(tmp, src)
print(f"sglang-kernel slimmed: dropped {dropped / 2**20:.0f} MiB unpacked, kept {kept / 2**20:.0f} MiB; "
      f"wheel now {os.path.getsize(src) / 2**20:.1f} MiB")
PY
fi
( cd "$WORK/w" && tar -cf "$WORK/bundle.tar" ./*.whl && sha256sum ./*.whl > "$WORK/SHA256SUMS" )
rm -rf "${OUT:?}"/p[0-9]*; mkdir -p "$OUT"
( cd "$WORK" && split -b "$CHUNK" -d -a 2 bundle.tar bundle.tar. )
i=0
for c in "$WORK"/bundle.tar.[0-9][0-9]; do i=$((i+1)); mkdir -p "$OUT/p$i"; mv "$c" "$OUT/p$i/"; done
cp "$WORK/SHA256SUMS" "$OUT/p$i/"
cp "$HERE/sglang_device_install.sh" "$OUT/p$i/device-install.sh"
echo "wheels: $(ls "$WORK"/w | wc -l), $(du -sm "$WORK/w" | cut -f1) MiB"
du -sh "$OUT"/p*
echo "parts: $i -- carry them one per call, back to back; the last call runs benchmarks/gpu/sglang_h200.sh (its header)"
