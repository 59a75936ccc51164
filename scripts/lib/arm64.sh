# Sourced by scripts/cross-arm64 and scripts/test-arm64 (issue #32): Debian 12's own arm64
# libraries on this x86-64 host (multiarch), which `dpkg-shlibdeps` (cargo-deb's `$auto`
# Depends) reads and which the arm64 binaries run against under qemu-aarch64. Needs root the
# first time (dpkg --add-architecture, apt-get).

# The arm64 run-time libraries of the daemon, the CLI and the PKCS#11 module (the TSS stack,
# libcrypto for it, glibc, libgcc), and of the arm64 pkcs11-tool (opensc, unpacked) that scripts/test-arm64 runs: zlib, glib.
ARM64_HOST_PACKAGES="libc6:arm64 libgcc-s1:arm64 libssl3:arm64 zlib1g:arm64 libglib2.0-0:arm64
    libtss2-esys-3.0.2-0:arm64 libtss2-tctildr0:arm64 libtss2-tcti-swtpm0:arm64
    libtss2-tcti-device0:arm64 libtss2-mu0:arm64 libtss2-rc0:arm64 libtss2-sys1:arm64"
# What the checks look for before installing them.
ARM64_HOST_FILES="/lib/ld-linux-aarch64.so.1 /usr/lib/aarch64-linux-gnu/libtss2-esys.so.0
    /usr/lib/aarch64-linux-gnu/libtss2-tcti-swtpm.so.0 /usr/lib/aarch64-linux-gnu/libtss2-rc.so.0
    /usr/lib/aarch64-linux-gnu/libcrypto.so.3 /usr/lib/aarch64-linux-gnu/libgio-2.0.so.0
    /usr/lib/aarch64-linux-gnu/libz.so.1"

# Adds the arm64 architecture to dpkg and installs ARM64_HOST_PACKAGES unless every file of
# ARM64_HOST_FILES is there.
arm64_host_libs() {
    local missing="" f
    for f in $ARM64_HOST_FILES; do [ -e "$f" ] || missing="$missing $f"; done
    [ -z "$missing" ] && return 0
    if [ "$(id -u)" != 0 ]; then
        echo "missing (arm64 libraries):$missing" >&2
        echo "install: dpkg --add-architecture arm64 && apt-get update && apt-get install $ARM64_HOST_PACKAGES" >&2
        exit 1
    fi
    echo "installing Debian's arm64 libraries (missing:$missing)" >&2
    dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq -o DPkg::Lock::Timeout=600
    # --no-remove: an arm64 library whose version differs from the installed amd64 one must
    # fail here, never replace the amd64 packages the build uses.
    # shellcheck disable=SC2086
    apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends --no-remove $ARM64_HOST_PACKAGES >/dev/null
}
