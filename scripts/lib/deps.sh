# Sourced by scripts/run and scripts/test: installs the Debian packages a script needs unless
# every tool it uses is already there. Usage:
#   need_tools "PACKAGES" "COMMANDS" "FILES" "PKG-CONFIG MODULES" ["ALREADY KNOWN MISSING"]
# Each command is looked up on PATH, each file must exist, each pkg-config module must be
# found; if anything is missing, all PACKAGES are installed with apt-get (as root), else the
# script stops with the list of what is missing.
need_tools() {
    local packages="$1" commands="$2" files="$3" modules="$4" missing="${5:+ $5}"
    for c in $commands; do command -v "$c" >/dev/null 2>&1 || missing="$missing $c"; done
    for f in $files; do [ -e "$f" ] || missing="$missing $f"; done
    for m in $modules; do pkg-config --exists "$m" 2>/dev/null || missing="$missing pkg-config:$m"; done
    [ -z "$missing" ] && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing packages (missing:$missing)" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        # shellcheck disable=SC2086
        apt-get install -y -qq --no-install-recommends $packages >/dev/null
    else
        echo "missing:$missing" >&2
        echo "install: apt-get install $packages" >&2
        exit 1
    fi
}
