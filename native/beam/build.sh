#!/bin/sh
# Build seqserve.service.scheduling._beam_kernel (native/beam/beam_kernel.c: the per-step
# update of the vectorised beam search, C99 on the CPython and numpy C APIs).
#   native/beam/build.sh [--clean] [PYTHON]     (default: python3)
#   --clean   afterwards purge the packages this run apt-installed (a C compiler), with apt's
#             caches: for an image's build stage
# Exit status non-zero, with a one-line reason, when it cannot build: the search then keeps
# its numpy code (Beams(kernel=None) uses the module only where it imports).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$(dirname "$here")")
clean=0
if [ "${1:-}" = "--clean" ]; then clean=1; shift; fi
py=${1:-python3}
installed_pkgs=""
tmp=$(mktemp -d)
log=$tmp/build.log
cleanup() {
    rm -rf "$tmp"
    if [ "$clean" = 1 ] && [ -n "$installed_pkgs" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get purge -y -q --auto-remove $installed_pkgs >/dev/null 2>&1 || true
        rm -rf /var/lib/apt/lists/*
        echo "native/beam/build.sh: --clean: purged $installed_pkgs" >&2
    fi
}
trap cleanup EXIT
fail() { echo "native/beam/build.sh: beam kernel unavailable: $*" >&2; exit 1; }

command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || fail "no python at $py"
case "$py" in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac
cc=${CC:-gcc}
if ! command -v "$cc" >/dev/null 2>&1; then
    # a fresh machine or an image's build stage (root, Debian): the compiler from apt
    command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] || fail "no C compiler ($cc)"
    echo "native/beam/build.sh: installing gcc" >&2
    installed_pkgs="gcc libc6-dev"
    get() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $installed_pkgs >"$log" 2>&1; }
    get || { apt-get update -q >/dev/null 2>&1 && get; } \
        || fail "apt-get install $installed_pkgs failed: $(tail -1 "$log")"
    command -v "$cc" >/dev/null 2>&1 || fail "no C compiler ($cc) after apt-get"
fi
ext=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') \
    || fail "cannot ask $py for EXT_SUFFIX"
pyinc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])') \
    || fail "cannot ask $py for its include folder"
[ -f "$pyinc/Python.h" ] || fail "no Python.h in $pyinc (python3-dev missing?)"
npinc=$("$py" -c 'import numpy; print(numpy.get_include())' 2>/dev/null) \
    || fail "numpy does not import in $py"
so=$tmp/_beam_kernel$ext
"$cc" -std=c99 -O2 -shared -fPIC -Wall -Wextra -Wno-unused-function \
    -I"$pyinc" -I"$npinc" "$here/beam_kernel.c" -o "$so" -lm >"$log" 2>&1 \
    || fail "$cc failed: $(grep -m1 -i error "$log" || tail -1 "$log")"
. "$root/native/place.sh"
place_module "$so" seqserve.service.scheduling._beam_kernel
