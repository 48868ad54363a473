# Sourced by native/build.sh and native/beam/build.sh (POSIX sh): `place_module FILE MODULE`
# puts a built extension FILE where the package imports MODULE (seqserve.a.b._name) from:
# this tree's seqserve/ and, where PYTHON has the package installed from a copy (pip install
# ., an image's virtualenv) rather than from this tree (pip install -e), beside that copy
# too; each checked by importing it. Needs the caller's $py, $root, $ext and fail().
place_module() {
    file=$1 module=$2
    rel=$(echo "${module#seqserve.}" | tr . /)$ext
    dest="$root/seqserve/$rel"
    cp "$file" "$dest.tmp" && mv "$dest.tmp" "$dest"
    "$py" -c 'import importlib, sys; sys.path.insert(0, sys.argv[1]); importlib.import_module(sys.argv[2])' "$root" "$module" >/dev/null 2>&1 \
        || fail "built, but $module does not import"
    echo "$0: built seqserve/$rel" >&2
    installed=$(cd / && "$py" -c 'import importlib.util as u; s = u.find_spec("seqserve"); print(s.submodule_search_locations[0] if s else "")' 2>/dev/null) || installed=""
    if [ -n "$installed" ] && [ "$(cd "$installed" && pwd -P)" != "$(cd "$root/seqserve" && pwd -P)" ]; then
        dest="$installed/$rel"
        cp "$file" "$dest.tmp" && mv "$dest.tmp" "$dest"
        (cd / && "$py" -c 'import importlib, sys; importlib.import_module(sys.argv[1])' "$module") >/dev/null 2>&1 \
            || fail "copied beside the installed package ($dest), but it does not import there"
        echo "$0: and beside the installed package: $dest" >&2
    fi
}
