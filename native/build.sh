#!/bin/sh
# Build the native HTTP front seqserve.service.server._front (Rust: hyper 0.14 + tokio + PyO3 0.17),
# offline, from Debian bookworm's librust-*-dev packages.
#   native/build.sh [--clean] [PYTHON]     (default: python3; run as root on a fresh machine)
#   --clean   afterwards (built or not) remove the build folder and purge the packages this run
#             installed, with apt's caches: for an image's build stage, whose disk is the build
#             machine's (the toolchain, crates and build folder are ~1.2 GB otherwise)
# Exit status non-zero when it cannot build: the caller then keeps uvicorn.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
clean=0
if [ "${1:-}" = "--clean" ]; then clean=1; shift; fi
py=${1:-python3}
installed_pkgs=""
cleanup() {
    [ "$clean" = 1 ] || return 0
    rm -rf "$here/front/target"
    if [ -n "$installed_pkgs" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get purge -y -q --auto-remove $installed_pkgs >/dev/null 2>&1 || true
        rm -rf /var/lib/apt/lists/* /tmp/native-apt.log
        echo "native/build.sh: --clean: purged$installed_pkgs and the build folder" >&2
    fi
}
trap cleanup EXIT
fail() { echo "native/build.sh: native front unavailable: $*" >&2; exit 1; }

command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || fail "no python at $py"
ext=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') \
    || fail "cannot ask $py for EXT_SUFFIX"

pkgs="cargo rustc librust-pyo3-dev librust-hyper-dev librust-tokio-dev librust-libc-dev librust-http-body-dev librust-bytes-dev"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    command -v apt-get >/dev/null 2>&1 || fail "missing packages:$missing (no apt-get)"
    echo "native/build.sh: installing$missing" >&2
    installed_pkgs=$missing
    get() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >/tmp/native-apt.log 2>&1; }
    get || { apt-get update -q >/dev/null 2>&1 && get; } \
      || fail "apt-get install$missing failed: $(tail -3 /tmp/native-apt.log 2>/dev/null | tr '\n' ' ')"
    [ "$clean" = 1 ] && apt-get clean >/dev/null 2>&1 || true
fi

# Debian's toolchain first (the registry's crates match it); any cargo otherwise.
if [ -x /usr/bin/cargo ] && [ -x /usr/bin/rustc ]; then
    cargo=/usr/bin/cargo; export RUSTC=/usr/bin/rustc
else
    cargo=$(command -v cargo) || fail "no cargo"
fi
[ -d /usr/share/cargo/registry/hyper-0.14.19 ] || [ -n "$(ls -d /usr/share/cargo/registry/hyper-0.14.* 2>/dev/null)" ] \
    || fail "no hyper 0.14 in /usr/share/cargo/registry"

case "$py" in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac
export PYO3_PYTHON=$(command -v "$py" 2>/dev/null || echo "$py")
cd "$here/front"
"$cargo" build --release --offline -j"${BUILD_JOBS:-2}" >&2 || fail "cargo build failed"
so="$here/front/target/release/lib_front.so"
[ -f "$so" ] || fail "no $so after the build"
. "$here/place.sh"
place_module "$so" seqserve.service.server._front
