#!/bin/sh
# Build seqserve.service.scheduling._beam_kernel (native/beam/beam_kernel.c: the per-step
# update of the vectorised beam search, C99 on the CPython and numpy C APIs).
#   native/beam/build.sh [PYTHON]     (default: python3)
# Exit status non-zero, with a one-line reason, when it cannot build: the search then keeps
# its numpy code (Beams(kernel=None) uses the module only where it imports).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$(dirname "$here")")
py=${1:-python3}
fail() { echo "native/beam/build.sh: beam kernel unavailable: $*" >&2; exit 1; }

command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || fail "no python at $py"
cc=${CC:-gcc}
command -v "$cc" >/dev/null 2>&1 || fail "no C compiler ($cc)"
ext=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') \
    || fail "cannot ask $py for EXT_SUFFIX"
pyinc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])') \
    || fail "cannot ask $py for its include folder"
[ -f "$pyinc/Python.h" ] || fail "no Python.h in $pyinc (python3-dev missing?)"
npinc=$("$py" -c 'import numpy; print(numpy.get_include())' 2>/dev/null) \
    || fail "numpy does not import in $py"
out="$root/seqserve/service/scheduling/_beam_kernel$ext"
log=$(mktemp)
trap 'rm -f "$log" "$out.tmp"' EXIT
"$cc" -std=c99 -O2 -shared -fPIC -Wall -Wextra -Wno-unused-function \
    -I"$pyinc" -I"$npinc" "$here/beam_kernel.c" -o "$out.tmp" -lm >"$log" 2>&1 \
    || fail "$cc failed: $(grep -m1 -i error "$log" || tail -1 "$log")"
mv "$out.tmp" "$out"
"$py" -c 'import sys; sys.path.insert(0, sys.argv[1]); import seqserve.service.scheduling._beam_kernel' "$root" >/dev/null 2>&1 \
    || fail "built, but seqserve.service.scheduling._beam_kernel does not import"
echo "native/beam/build.sh: built seqserve/service/scheduling/_beam_kernel$ext" >&2
