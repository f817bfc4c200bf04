#!/usr/bin/env bash
# The QEMU that runs the nested kvm road's L1 (ci/kvm-nested.sh): Debian bookworm-backports'
# qemu-system-x86 10.0, extracted into a prefix of its own beside the system's QEMU 7.2 (which
# the tcg driver and every other test keep using). Under 7.2's emulated SVM the L1 lost its
# LAPIC timer interrupt (IRR 236 pending, never delivered, an NMI no help) and stalled in about
# half its runs; under 10.0 no stall was seen (docs/testing.md has the counts).
#
#   images/qemu-l1.sh               fetch and extract if missing; print the qemu-system-x86_64 path
#   images/qemu-l1.sh --print-path  print it if present, else exit 1 (fetches nothing)
#   images/qemu-l1.sh --force       fetch again
#
# The packages come through apt with a state of their own (its lists and archives in a temporary
# directory): the machine's own sources, with bookworm-backports added to the suites of the
# entry that has bookworm, so the system's apt configuration and packages are not touched.
# Cached in ${XDG_CACHE_HOME:-~/.cache}/vm/qemu-l1/<key>/, <key> hashing this script and the
# version asked for; built in a temporary directory and renamed when complete.
set -euo pipefail

say() { echo "qemu-l1: $*" >&2; }
die() { echo "qemu-l1: ERROR: $*" >&2; exit 1; }

version=1:10.0.2+ds-2+deb13u1~bpo12+1
here=$(dirname "${BASH_SOURCE[0]}")
# shellcheck source=../ci/lib.sh
source "$here/../ci/lib.sh"
cache_args qemu-l1 "$@"
key=$({ cat "${BASH_SOURCE[0]}"; echo "$version"; } | sha256sum | cut -c1-16)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/vm/qemu-l1
dir=$cache/$key
bin=$dir/usr/bin/qemu-system-x86_64
built() { [[ -x $bin ]] && "$bin" --version >/dev/null 2>&1; }
cache_hit "$bin" built
mkdir -p "$cache"
cache_lock "$cache/.lock" "$bin" built

tmp=$(mktemp -d "$cache/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
mkdir -p "$tmp/parts" "$tmp/lists/partial" "$tmp/debs/partial" "$tmp/root"
: >"$tmp/none.list"
found=0
for f in /etc/apt/sources.list.d/*.sources; do
    [[ -e $f ]] || continue
    # The suite bookworm itself (not bookworm-security, bookworm-updates) as a word.
    word='(.*[[:space:]])?bookworm([[:space:]].*)?'
    if grep -qE "^Suites:[[:space:]]*$word\$" "$f"; then
        sed -E "s/^(Suites:[[:space:]]*$word)\$/\1 bookworm-backports/" "$f" >"$tmp/parts/$(basename "$f")"
        found=1
    else
        cp "$f" "$tmp/parts/"
    fi
done
if ((!found)) && [[ -f /etc/apt/sources.list ]]; then
    # One-line sources: the bookworm line again with the suite changed.
    sed -nE 's/^(deb [^#]*[[:space:]])bookworm([[:space:]].*)$/\1bookworm-backports\2/p' \
        /etc/apt/sources.list >"$tmp/parts/backports.list"
    [[ -s $tmp/parts/backports.list ]] && found=1
fi
((found)) || die "no bookworm entry in the apt sources to add bookworm-backports beside"
apt_opts=(-o "Dir::Etc::sourcelist=$tmp/none.list" -o "Dir::Etc::sourceparts=$tmp/parts"
    -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache::archives=$tmp/debs")
say "apt-get update (own state) and download qemu-system-x86 $version"
apt-get -q "${apt_opts[@]}" update >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log" >&2; die "apt-get update failed"; }
# --download-only resolves against the installed system: what the newer QEMU needs beyond it.
# Backports keeps only its newest build: once $version is gone, the newest is taken, said loudly.
fetch() {
    apt-get -q -y "${apt_opts[@]}" install --download-only --no-install-recommends \
        -t bookworm-backports "$1" >>"$tmp/apt.log" 2>&1
}
if ! fetch "qemu-system-x86=$version"; then
    say "WARNING: qemu-system-x86 $version is no longer in bookworm-backports; taking its newest"
    fetch qemu-system-x86 ||
        { tail -n 20 "$tmp/apt.log" >&2; die "apt-get install --download-only qemu-system-x86 failed"; }
fi
for deb in "$tmp"/debs/*.deb; do
    dpkg-deb -x "$deb" "$tmp/root" || die "dpkg-deb -x $deb failed"
done
[[ -x $tmp/root/usr/bin/qemu-system-x86_64 ]] || die "no qemu-system-x86_64 in the packages fetched"
# It runs with the system's libraries (ci/kvm-nested.sh sets no library path).
missing=$(ldd "$tmp/root/usr/bin/qemu-system-x86_64" | grep 'not found' || true)
[[ -z $missing ]] || die "qemu-system-x86_64 lacks libraries: $missing"
rm -rf "$dir"
mv "$tmp/root" "$dir"
built || die "the extracted QEMU does not run: $bin --version"
say "extracted $("$bin" --version | head -n1) into $dir ($((SECONDS - start)) s)"
echo "$bin"
