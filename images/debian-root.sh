# shellcheck shell=bash
# Sourced by images/rootfs-debian.sh and images/onnx-image.sh: one way to build a Debian
# userland root with mmdebstrap (essential variant plus PACKAGES; docs, man pages and
# locales excluded; services refused by a policy-rc.d during the install; a user `app`
# 1000:1000 with a home). Callers hash this file into their cache keys.
#
#   debian_root SUITE PACKAGES DEST [MIRROR]
debian_root() {
    local suite=$1 packages=$2 dest=$3 mirror=${4:-}
    mmdebstrap --quiet --variant=essential --include="$packages" \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-include=/usr/share/locale/locale.alias' \
        --setup-hook='mkdir -p "$1/usr/sbin" && printf "#!/bin/sh\nexit 101\n" >"$1/usr/sbin/policy-rc.d" && chmod 755 "$1/usr/sbin/policy-rc.d"' \
        --customize-hook='rm -f "$1/usr/sbin/policy-rc.d"' \
        --customize-hook='echo "app:x:1000:1000:app:/home/app:/bin/sh" >>"$1/etc/passwd"' \
        --customize-hook='echo "app:x:1000:" >>"$1/etc/group"' \
        --customize-hook='mkdir -p "$1/home/app" && chown 1000:1000 "$1/home/app"' \
        --customize-hook='rm -rf "$1/var/cache/apt"/*.bin "$1/var/lib/apt/lists"/*' \
        "$suite" "$dest" ${mirror:+"$mirror"}
}
