#!/usr/bin/env bash
# Kubernetes' CRI conformance suite (critest, cri-tools v1.32.0) against the shim, offline:
#
#   ci/critest.sh [build|run]     (no argument: both)
#
#   build   Go 1.23 from Debian bookworm-backports (its two .debs fetched with apt-get download
#           through an apt configuration of its own, unpacked: the machine's sources are not
#           touched), critest built from the kit's vendored source (`go test -c`), the kit's
#           stand-ins compiled and its test images built (mkimages.py, on a copy whose /bin/sh
#           is Debian's dynamic busybox: ci/critest-sh.py says why). Each is cached under
#           ~/.cache/vm/critest/, keyed by its inputs; ci/setup-tests.sh runs this.
#   run     shim/tests/critest.rs (excluded from the default test set): the node shim/tests/cri.rs
#           makes, the images pushed to a registry in its network namespace, critest run against
#           it; fails on any spec failing outside the test's list of refusals by design, and
#           prints "critest: N passed, N failed, N skipped".
#
# The kit is ../shared/critest beside the repository (CI's clean clone has it there), or
# $VM_CRITEST_KIT; without it this fails, saying so. Needs ci/setup.sh and ci/setup-tests.sh.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
# shellcheck source=lib.sh
source ci/lib.sh

say() { echo "critest: $*" >&2; }
die() { echo "critest: ERROR: $*" >&2; exit 1; }

what=${1:-all}
case $what in build | run | all) ;; *) die "unknown argument '$what' (build, run or nothing)" ;; esac

kit=${VM_CRITEST_KIT:-$repo/../shared/critest}
[[ -d $kit/cri-tools-v1.32.0/vendor && -f $kit/images/mkimages.py ]] ||
    die "no critest kit at $kit (cri-tools-v1.32.0/ with vendor/, images/mkimages.py): put ../shared/critest beside the repository or set VM_CRITEST_KIT"
kit=$(cd "$kit" && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/vm/critest
mkdir -p "$cache"
hash_of() { sha256sum | cut -c1-16; }

# --- Go 1.23 (bookworm-backports), unpacked beside the cache ----------------------------------
go_dir=$cache/go-1.23
go=$go_dir/usr/lib/go-1.23/bin/go
fetch_go() {
    [[ -x $go ]] && return 0
    local apt=$cache/apt mirror
    # The mirror the machine's own sources use (one-line or deb822 format).
    mirror=$(grep -rhE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null |
        grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -1 | tr -d ' ') || true
    [[ -n $mirror ]] || mirror=http://deb.debian.org/debian
    mkdir -p "$apt/lists/partial" "$apt/debs"
    echo "deb ${mirror%/} bookworm-backports main" >"$apt/sources.list"
    local opts=(-o "Dir::Etc::sourcelist=$apt/sources.list" -o Dir::Etc::sourceparts=/dev/null
        -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache::Archives=$apt/debs"
        -o APT::Sandbox::User=root)
    say "fetching golang-1.23-go and golang-1.23-src from bookworm-backports ($mirror)"
    apt-get "${opts[@]}" update >&2 || die "apt-get update of bookworm-backports failed"
    (cd "$apt/debs" && apt-get "${opts[@]}" download golang-1.23-go golang-1.23-src >&2) ||
        die "apt-get download of Go 1.23 failed"
    local tmp
    tmp=$(mktemp -d "$cache/.go.XXXXXX")
    for deb in "$apt"/debs/golang-1.23-*.deb; do dpkg-deb -x "$deb" "$tmp"; done
    [[ -x $tmp/usr/lib/go-1.23/bin/go ]] || die "the .debs held no usr/lib/go-1.23/bin/go"
    rm -rf "$go_dir" && mv "$tmp" "$go_dir"
}

# --- critest, from the kit's vendored source -------------------------------------------------
src=$kit/cri-tools-v1.32.0
critest_key() {
    { "$go" version; (cd "$src" && find . -type f -printf '%P %s\n' | LC_ALL=C sort); } | hash_of
}
build_critest() {
    local out=$cache/bin-$(critest_key)
    if [[ ! -x $out/critest ]]; then
        say "building critest from $src (go test -c, offline)"
        local tmp
        tmp=$(mktemp -d "$cache/.bin.XXXXXX")
        (cd "$src" && GOTOOLCHAIN=local GOFLAGS=-mod=vendor GOPROXY=off CGO_ENABLED=0 \
            GOCACHE=$cache/gocache GOPATH=$cache/gopath \
            "$go" test -c -o "$tmp/critest" ./cmd/critest >&2) || die "go test -c ./cmd/critest failed"
        rm -rf "$out" && mv "$tmp" "$out"
    fi
    echo "$out/critest"
}

# --- critest's test images (the kit's mkimages.py), built from a copy of its sources ---------
images_key() {
    { cat "$kit"/images/mkimages.py "$kit"/images/build-stand-ins.sh "$kit"/images/src/*;
        cat "$repo/ci/critest-sh.py"; dpkg-query -W busybox-static libc6 2>/dev/null;
        apt-cache show --no-all-versions busybox 2>/dev/null | grep -m1 '^Version:';
        cc --version | head -1; } | hash_of
}
# fetch_sh DIR: Debian's dynamically linked busybox, unpacked into DIR; prints its path. The
# images' /bin/sh (ci/critest-sh.py says why).
fetch_sh() {
    (cd "$1" && { apt-get download busybox >&2 || { apt-get update >&2 && apt-get download busybox >&2; }; }) ||
        die "apt-get download busybox (the images' /bin/sh) failed"
    dpkg-deb -x "$1"/busybox_*.deb "$1/root" || die "dpkg-deb -x of busybox failed"
    [[ -x $1/root/bin/busybox ]] || die "the busybox package held no bin/busybox"
    echo "$1/root/bin/busybox"
}
build_images() {
    local out=$cache/images-$(images_key)
    if [[ ! -f $out/out/plan.json ]]; then
        say "building critest's test images (mkimages.py build)"
        local tmp
        tmp=$(mktemp -d "$cache/.images.XXXXXX")
        cp -r "$kit/images" "$tmp/kit"
        bash "$tmp/kit/build-stand-ins.sh" >&2 || die "compiling the kit's stand-ins failed"
        mkdir "$tmp/sh"
        python3 "$repo/ci/critest-sh.py" "$tmp/kit/mkimages.py" "$(fetch_sh "$tmp/sh")" >&2 ||
            die "giving the images an exec-by-PATH /bin/sh failed"
        python3 "$tmp/kit/mkimages.py" build "$tmp/out" >&2 || die "mkimages.py build failed"
        rm -rf "$tmp/sh"
        rm -rf "$out" && mv "$tmp" "$out"
    fi
    echo "$out"
}

start=$SECONDS
fetch_go
critest=$(build_critest)
images=$(build_images)
ci_time "critest: build (Go, critest, images)" "$start"
[[ $what != build ]] || exit 0

start=$SECONDS
status=0
VM_CRITEST=$critest VM_CRITEST_IMAGES=$images/out VM_CRITEST_MKIMAGES=$images/kit/mkimages.py \
    cargo nextest run -p vm-shim --test critest --ignore-default-filter --no-capture \
    --no-fail-fast || status=$?
ci_time "critest: run" "$start" "$( ((status == 0)) && echo ok || echo "failed (exit $status)")"
exit "$status"
