# Shell helpers shared by ci/ and images/ (source it; it defines functions only):
#
#   vm_images_dir                 the images directory: $VM_IMAGES_DIR, else
#                                 ${XDG_CACHE_HOME:-$HOME/.cache}/vm/images
#   apt_install_missing TAG PKG…  apt-get install (after apt-get update) only the
#                                 packages dpkg does not list as installed; sudo when
#                                 not root; services the packages would start are
#                                 refused (policy-rc.d); progress on stderr, prefixed TAG.
#                                 Returns 1 when the install fails.
#
# CI's time as a budget: every phase of a run appends one line to the timing file
# $VM_CI_TIMES (ci/test-all.sh sets it; unset, nothing is written), which ci/test.sh prints in
# its summary:
#
#   ci_time PHASE START [STATUS]  appends "PHASE<TAB>SECONDS<TAB>STATUS" (STATUS ok by default),
#                                 SECONDS being the time since START, an earlier $SECONDS.
#   ci_timed PHASE CMD…           runs CMD…, then ci_time PHASE with ok or "failed (exit N)";
#                                 returns CMD's status. CMD runs in this shell (a function may
#                                 set variables), under `set -e`'s exemption for `||` lists.
#
# The cached builds of images/ (one output directory per input hash, built in a temporary
# directory and renamed into place, under a lock) share their prologue:
#
#   cache_args TAG ARG…           parses the arguments every cached build takes: --force
#                                 (rebuild) sets CACHE_FORCE=1, --print-path (print the output
#                                 if it is built, else exit 1; build nothing) sets
#                                 CACHE_PRINT_ONLY=1; anything else is an error naming TAG.
#   cache_hit PRINT CHECK…        unless --force: when the command CHECK… succeeds, prints
#                                 PRINT and exits 0. Then, with --print-path, exits 1.
#                                 Otherwise returns: the caller builds.
#   cache_lock LOCK PRINT CHECK…  takes the lock file LOCK (its directory created; fd 9, held
#                                 until the script exits), then cache_hit again: another
#                                 run may have built it meanwhile.

vm_images_dir() {
    echo "${VM_IMAGES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vm/images}"
}

apt_install_missing() {
    local tag=$1 p
    shift
    if ! command -v dpkg-query >/dev/null; then
        echo "$tag: ERROR: not a Debian machine (dpkg-query missing)" >&2
        return 1
    fi
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if ((${#missing[@]} == 0)); then
        echo "$tag: apt packages present" >&2
        return 0
    fi
    local sudo=()
    ((EUID == 0)) || sudo=(sudo)
    echo "$tag: apt-get install ${missing[*]}" >&2
    "${sudo[@]}" apt-get update -qq >&2 || { echo "$tag: ERROR: apt-get update failed" >&2; return 1; }
    # Some packages (docker-registry) start a service when installed; the tests start their
    # own on a free port, so installs run under a policy-rc.d that refuses (exit 101).
    local policy=/usr/sbin/policy-rc.d own_policy=0 rc=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
        "${sudo[@]}" chmod 755 "$policy"
        own_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >&2 || rc=$?
    ((own_policy == 0)) || "${sudo[@]}" rm -f "$policy"
    if ((rc != 0)); then
        echo "$tag: ERROR: apt-get install ${missing[*]} failed" >&2
        return 1
    fi
}

ci_time() {
    [[ -n ${VM_CI_TIMES:-} ]] || return 0
    printf '%s\t%d\t%s\n' "$1" $((SECONDS - $2)) "${3:-ok}" >>"$VM_CI_TIMES"
}

ci_timed() {
    local phase=$1 start=$SECONDS rc=0
    shift
    "$@" || rc=$?
    if ((rc == 0)); then ci_time "$phase" "$start"; else ci_time "$phase" "$start" "failed (exit $rc)"; fi
    return "$rc"
}

cache_args() {
    local tag=$1 a
    shift
    CACHE_FORCE=0 CACHE_PRINT_ONLY=0
    for a in "$@"; do
        case $a in
            --force) CACHE_FORCE=1 ;;
            --print-path) CACHE_PRINT_ONLY=1 ;;
            *) echo "$tag: ERROR: unknown argument $a (use --print-path or --force)" >&2; exit 2 ;;
        esac
    done
}

cache_hit() {
    local print=$1
    shift
    if ((!CACHE_FORCE)) && "$@"; then
        echo "$print"
        exit 0
    fi
    ((!CACHE_PRINT_ONLY)) || exit 1
}

cache_lock() {
    local lock=$1
    shift
    mkdir -p "$(dirname "$lock")"
    exec 9>"$lock"
    flock 9
    cache_hit "$@"
}
