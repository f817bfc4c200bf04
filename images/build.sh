#!/usr/bin/env bash
# Builds and caches everything a `vm` guest needs, with one command:
#
#   images/build.sh [--kernel tuned|debian] [--force] [--print-dir]
#
#   (no flag)    build what is missing, then point <images dir>/current at it
#   --kernel K   tuned (default): compile our kernel (images/kernel/, ~6 min on 2 cores);
#                debian: take Debian's cloud kernel package instead (a download, no compiler),
#                its drivers as modules in the initramfs (the agent loads them, then turns
#                module loading off). Boots on the tcg road only (its virtio devices are found
#                through ACPI, which QEMU's microvm gives and our VMM does not yet); `current`
#                moves to it only while no tuned set is current.
#   --force      rebuild the kernel and the image even if cached
#   --print-dir  print the resolved current image directory and exit
#                (builds nothing; fails if nothing was built yet)
#
# <images dir> = ${VM_IMAGES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vm/images}
#
#   kernels/<khash>/  vmlinux bzImage config gen_init_cpio kernel.info build.log
#       khash = sha256(linux-source-6.12 package version, gcc version,
#                      images/kernel/{build-kernel.sh,vm.config,patches/*})
#       so an agent change never rebuilds the kernel.
#   kernels/<khash>/  bzImage config modules/{*.ko,order} kernel.info   (--kernel debian)
#       khash = sha256(the Debian package and version, the module list, this script)
#   <hash>/           [vmlinux] bzImage initramfs.cpio initramfs.spec config manifest.json
#       initramfs.cpio is packed by images/newc.py from initramfs.spec (host paths of
#       this machine: what went in, and from where)
#       hash = sha256(khash, sha256 of the static vm-agent, busybox version
#                     and sha256, this script, images/initramfs/**)
#   current -> <hash> (replaced atomically)
#   agent-target/     cargo target dir of the static agent build
#                     (override with VM_AGENT_TARGET_DIR)
#   logs/             kernel build logs
#
# Everything is built in <images dir>/.tmp.* and renamed into place, so an
# interrupted build never leaves a half cache entry. A lock serializes
# concurrent runs. Progress goes to stderr; --print-dir writes stdout only.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
images_src=$repo/images
# shellcheck source=../ci/lib.sh
source "$repo/ci/lib.sh"
images_dir=$(vm_images_dir)
agent_target=${VM_AGENT_TARGET_DIR:-$images_dir/agent-target}
rust_target=x86_64-unknown-linux-gnu
# Packages the build needs (Debian names); the tuned kernel's compile needs the rest.
packages=(cpio busybox-static binutils python3)
tuned_packages=(linux-source-6.12 build-essential patch bc flex bison libelf-dev libssl-dev lz4)
# --kernel debian: the package (a dependency of this metapackage) and the drivers a guest needs
# that it builds as modules (their dependencies are added from each module's own list).
debian_meta=linux-image-cloud-amd64
debian_modules=(virtio_mmio virtio_blk vmw_vsock_virtio_transport virtio-rng erofs overlay fuse
    virtiofs)
# The initramfs must offer at least these busybox applets (all are linked).
required_applets=(sh ls cat echo mount ps sleep uname ip ifconfig wget nc httpd head dd sync
    grep seq kill mkdir rm true false env id free)

say() { echo "images: $*" >&2; }
die() { echo "images: ERROR: $*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

force=0 print_dir=0 kernel_kind=tuned
usage="usage: images/build.sh [--kernel tuned|debian] [--force] [--print-dir]"
while (($#)); do
    case $1 in
    --force) force=1 ;;
    --print-dir) print_dir=1 ;;
    --kernel)
        (($# > 1)) || die "--kernel needs a value ($usage)"
        kernel_kind=$2
        shift
        ;;
    --kernel=*) kernel_kind=${1#--kernel=} ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' ($usage)" ;;
    esac
    shift
done
[[ $kernel_kind == tuned || $kernel_kind == debian ]] ||
    die "unknown kernel '$kernel_kind' (tuned or debian)"

if ((print_dir)); then
    [[ -e $images_dir/current/manifest.json ]] ||
        die "no images in $images_dir yet; run images/build.sh"
    readlink -f "$images_dir/current"
    exit 0
fi

start=$SECONDS
mkdir -p "$images_dir/kernels" "$images_dir/logs"

# --- serialize concurrent runs; clean up what a killed run left behind ------
exec 9>"$images_dir/.lock"
if ! flock -n 9; then
    say "waiting for another images/build.sh to finish"
    flock 9
fi
rm -rf "$images_dir"/.tmp.*
tmp= kernel_pid=
cleanup() {
    # Stop a running kernel build first (its whole process group: make and
    # the compilers), then drop the half-built temp dir.
    if [[ -n $kernel_pid ]]; then
        kill -TERM -- "-$kernel_pid" 2>/dev/null || true
        for _ in {1..50}; do
            kill -0 -- "-$kernel_pid" 2>/dev/null || break
            sleep 0.1
        done
        wait "$kernel_pid" 2>/dev/null || true
    fi
    [[ -z $tmp ]] || rm -rf "$tmp" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
new_tmp() { tmp=$(mktemp -d "$images_dir/.tmp.XXXXXX"); }

# --- host packages ----------------------------------------------------------
[[ $kernel_kind == debian ]] || packages+=("${tuned_packages[@]}")
apt_install_missing images "${packages[@]}" || die "cannot install the packages the build needs"

# --- kernel (cached by khash) -------------------------------------------------
# `modinfo -F depends` without kmod: the module's .modinfo section.
module_depends() {
    objcopy -O binary --only-section=.modinfo "$1" /dev/stdout 2>/dev/null |
        tr '\0' '\n' | sed -n 's/^depends=//p' | tr ',' ' '
}

# Debian's kernel: its bzImage, config and the modules in $debian_modules with their
# dependencies, dependencies first in modules/order.
debian_kernel() {
    local out=$1 work=$2 pkg version deb tree
    pkg=$(apt-cache depends "$debian_meta" 2>/dev/null |
        sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | head -n1)
    [[ -n $pkg ]] || die "apt knows no $debian_meta (apt-get update?)"
    version=$(apt-cache show "$pkg" | sed -n 's/^Version: //p' | head -n1)
    mkdir -p "$work" "$out/modules"
    say "downloading $pkg $version"
    (cd "$work" && apt-get download -q "$pkg=$version" >/dev/null 2>&1) ||
        die "apt-get download $pkg=$version failed"
    deb=$(ls "$work"/*.deb)
    dpkg-deb -x "$deb" "$work/x" || die "dpkg-deb -x $deb failed"
    cp "$work"/x/boot/vmlinuz-* "$out/bzImage"
    cp "$work"/x/boot/config-* "$out/config"
    tree=$(echo "$work"/x/lib/modules/*)
    declare -A path=() seen=()
    local f name
    while IFS= read -r f; do
        name=$(basename "$f" .ko)
        path[${name//-/_}]=$f
    done < <(find "$tree" -name '*.ko')
    add() {
        local m=${1//-/_} d
        [[ -z ${seen[$m]:-} ]] || return 0
        [[ -n ${path[$m]:-} ]] || die "$pkg has no module $1"
        seen[$m]=1
        for d in $(module_depends "${path[$m]}"); do add "$d"; done
        cp "${path[$m]}" "$out/modules/"
        basename "${path[$m]}" >>"$out/modules/order"
    }
    for f in "${debian_modules[@]}"; do add "$f"; done
    {
        echo "release=$(basename "$tree")"
        echo "package=$pkg $version"
        echo "built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "build_seconds=0"
    } >"$out/kernel.info"
    rm -rf "$work"
}

kernel_inputs() {
    if [[ $kernel_kind == debian ]]; then
        local pkg sudo=()
        ((EUID == 0)) || sudo=(sudo)
        apt-cache show "$debian_meta" >/dev/null 2>&1 || "${sudo[@]}" apt-get update -qq >&2 ||
            die "apt-get update failed"
        pkg=$(apt-cache depends "$debian_meta" 2>/dev/null |
            sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | head -n1)
        echo "debian $pkg $(apt-cache show "$pkg" 2>/dev/null | sed -n 's/^Version: //p' | head -n1)"
        echo "modules ${debian_modules[*]}"
        sha "$images_src/build.sh"
        return
    fi
    echo "linux-source-6.12 $(dpkg-query -W -f='${Version}' linux-source-6.12)"
    echo "cc $(cc --version | head -n1)"
    (cd "$images_src/kernel" && sha256sum build-kernel.sh vm.config patches/*.patch)
}
khash=$(kernel_inputs | sha256sum | cut -c1-16)
kdir=$images_dir/kernels/$khash
if [[ $kernel_kind == debian ]] && { ((force)) || [[ ! -f $kdir/kernel.info ]]; }; then
    kernel_start=$SECONDS
    new_tmp
    debian_kernel "$tmp/out" "$tmp/work"
    rm -rf "$kdir"
    mv "$tmp/out" "$kdir"
    rm -rf "$tmp"
    tmp=
    ci_time "images: Debian kernel (download, modules)" "$kernel_start"
elif ((force)) || [[ ! -f $kdir/kernel.info ]]; then
    kernel_start=$SECONDS
    new_tmp
    log=$images_dir/logs/kernel-$khash.log
    estimate=$(cat "$images_dir/kernels/.objects" 2>/dev/null || echo 1100)
    say "building kernel $khash (~4 min on 2 cores)"
    # In the background, in its own process group (setsid: its pid is the
    # group id), so a signal to this script is handled at once and stops it all.
    VM_KERNEL_OBJECTS_ESTIMATE=$estimate \
        setsid "$images_src/kernel/build-kernel.sh" "$tmp/out" "$tmp/work" "$log" &
    kernel_pid=$!
    wait "$kernel_pid" || { kernel_pid=; die "kernel build failed (see above)"; }
    kernel_pid=
    rm -rf "$kdir.old"
    [[ ! -e $kdir ]] || mv "$kdir" "$kdir.old"
    mv "$tmp/out" "$kdir"
    rm -rf "$kdir.old" "$tmp"
    tmp=
    sed -n 's/^objects=//p' "$kdir/kernel.info" >"$images_dir/kernels/.objects"
    ci_time "images: kernel build" "$kernel_start"
fi

# --- guest agent: static vm-agent ---------------------------------------------
# --target keeps RUSTFLAGS away from build scripts and proc macros.
say "vm-agent: cargo build --release, static (target dir $agent_target)"
agent_start=$SECONDS
(cd "$repo" && RUSTFLAGS='-C target-feature=+crt-static' cargo build --quiet --release \
    -p guest-agent --bin vm-agent --target "$rust_target" --target-dir "$agent_target") ||
    die "cargo build of the guest agent failed"
ci_time "images: vm-agent build (static, release)" "$agent_start"
agent=$agent_target/$rust_target/release/vm-agent
[[ -x $agent ]] || die "$agent missing after cargo build"
if grep -q NEEDED <<<"$(readelf -d "$agent")" || grep -q INTERP <<<"$(readelf -l "$agent")"; then
    die "$agent is dynamically linked (NEEDED/INTERP present); crt-static did not apply"
fi

# --- the image set (cached by hash) -------------------------------------------
busybox=/bin/busybox
busybox_version=$(dpkg-query -W -f='${Version}' busybox-static)
image_inputs() {
    echo "kernel $kernel_kind $khash"
    echo "agent $(sha "$agent")"
    echo "busybox $busybox_version $(sha "$busybox")"
    (cd "$repo" && find images/build.sh images/verify.sh images/newc.py images/initramfs -type f -print0 |
        sort -z | xargs -0 sha256sum)
}
hash=$(image_inputs | sha256sum | cut -c1-16)
dir=$images_dir/$hash

# set_current <how>: point current at this set, saying so; a Debian-kernel set stands in only
# until a tuned one is current.
set_current() {
    if [[ $kernel_kind == debian ]] && [[ -f $images_dir/current/vmlinux ]]; then
        say "current stays at the tuned kernel ($(readlink "$images_dir/current"))"
        return
    fi
    ln -sfn "$hash" "$images_dir/.current.$$"
    mv -T "$images_dir/.current.$$" "$images_dir/current"
    [[ -z $1 ]] || say "current -> $hash ($1)"
}

if ((!force)) && [[ -f $dir/manifest.json ]]; then
    if [[ $(readlink "$images_dir/current" 2>/dev/null) != "$hash" ]]; then
        set_current "already built"
    fi
    echo "images up to date: $dir ($((SECONDS - start))s)" >&2
    exit 0
fi

new_tmp
out=$tmp/image
mkdir -p "$out"
kernel_files=(bzImage config)
[[ $kernel_kind == debian ]] || kernel_files+=(vmlinux)
for f in "${kernel_files[@]}"; do
    ln "$kdir/$f" "$out/$f" 2>/dev/null || cp "$kdir/$f" "$out/$f"
done

# Initramfs layout (gen_init_cpio spec): /init = agent; busybox with every
# applet linked in /bin; /sbin, /usr/bin, /usr/sbin point at /bin.
spec=$tmp/initramfs.spec
{
    echo "dir /dev 0755 0 0"
    echo "nod /dev/console 0600 0 0 c 5 1"
    echo "nod /dev/null 0666 0 0 c 1 3"
    for d in proc sys; do echo "dir /$d 0555 0 0"; done
    echo "dir /tmp 1777 0 0"
    for d in mnt run etc bin usr; do echo "dir /$d 0755 0 0"; done
    echo "dir /root 0700 0 0"
    for f in "$images_src"/initramfs/etc/*; do
        echo "file /etc/$(basename "$f") $f 0644 0 0"
    done
    echo "file /bin/busybox $busybox 0755 0 0"
    "$busybox" --list | grep -vx busybox | sort | while read -r applet; do
        echo "slink /bin/$applet busybox 0777 0 0"
    done
    echo "slink /sbin bin 0777 0 0"
    echo "slink /usr/bin ../bin 0777 0 0"
    echo "slink /usr/sbin ../bin 0777 0 0"
    echo "file /init $agent 0755 0 0"
    if [[ $kernel_kind == debian ]]; then
        # The agent's kmod::MODULE_DIR and ORDER_FILE.
        for d in lib lib/modules lib/modules/vm; do echo "dir /$d 0755 0 0"; done
        while read -r m; do
            echo "file /lib/modules/vm/$m $kdir/modules/$m 0644 0 0"
        done <"$kdir/modules/order"
        echo "file /lib/modules/vm/order $kdir/modules/order 0644 0 0"
    fi
} >"$spec"
for a in "${required_applets[@]}"; do
    grep -q "^slink /bin/$a busybox " "$spec" || die "busybox ($busybox) lacks the '$a' applet"
done
python3 "$images_src/newc.py" "$spec" >"$out/initramfs.cpio" || die "images/newc.py failed"
cp "$spec" "$out/initramfs.spec"

# manifest.json
json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }
file_entry() { printf '"%s": {"sha256": "%s", "size": %s}' "$1" "$(sha "$out/$1")" "$(stat -c %s "$out/$1")"; }
kinfo() { sed -n "s/^$1=//p" "$kdir/kernel.info"; }
{
    echo "{"
    echo "  \"format\": 1,"
    echo "  \"hash\": \"$hash\","
    echo "  \"built_at\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
    echo "  \"kernel\": {\"kind\": \"$kernel_kind\", \"hash\": \"$khash\", \"release\": $(json_str "$(kinfo release)"),"
    if [[ $kernel_kind == debian ]]; then
        echo "             \"package\": $(json_str "$(kinfo package)"),"
    else
        echo "             \"source_package\": $(json_str "linux-source-6.12 $(dpkg-query -W -f='${Version}' linux-source-6.12)"),"
        echo "             \"compiler\": $(json_str "$(cc --version | head -n1)"),"
    fi
    echo "             \"built_at\": $(json_str "$(kinfo built_at)"), \"build_seconds\": $(kinfo build_seconds)},"
    echo "  \"agent\": {\"sha256\": \"$(sha "$agent")\", \"rustc\": $(json_str "$(rustc --version)")},"
    echo "  \"busybox\": {\"package_version\": $(json_str "$busybox_version"), \"sha256\": \"$(sha "$busybox")\"},"
    echo "  \"files\": {"
    [[ $kernel_kind == debian ]] || echo "    $(file_entry vmlinux),"
    echo "    $(file_entry bzImage),"
    echo "    $(file_entry initramfs.cpio),"
    echo "    $(file_entry config)"
    echo "  }"
    echo "}"
} >"$out/manifest.json"

"$images_src/verify.sh" "$out" >&2 || die "verification of the new image set failed"

rm -rf "$dir"
mv "$out" "$dir"
set_current ""
echo "images ready: $dir ($((SECONDS - start))s)" >&2
