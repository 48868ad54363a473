#!/usr/bin/env bash
# Builds the Dockerfile's serving image with buildah (no Docker engine needed), runs it and
# checks it over HTTP. Root on Debian/Ubuntu; installs buildah (and debootstrap) with apt-get
# when missing.
#
#   deploy/build-image.sh [cpu] [--bundles DIR] [--tag NAME] [--no-check]
#
#   cpu            the target (the only one built here: the gpu target's CUDA base image cannot be
#                  pulled on these machines; tests/deploy lints it)
#   --bundles DIR  bake the bundle folders of DIR (NAME/VERSION/...) into /models
#                  (the Dockerfile's BAKE_DEMO_MODELS=1 + BUNDLES_DIR); the checks need them
#   --tag NAME     image name (default localhost/seqserve:cpu)
#   --no-check     build only
#   --check-only   check the image already built under --tag (no build)
#
# Base image: the Dockerfile's PYTHON_IMAGE when it is in local storage or can be pulled; else a
# local Debian bookworm base made once with `debootstrap --variant=minbase` (python3,
# python3-venv, a `python` link), cached as a rootfs tarball under $SEQSERVE_IMAGE_CACHE
# (default /var/tmp/seqserve-image-base) and as the image localhost/seqserve-python-base.
#
# The build sees this machine's pip configuration read-only: its config files (/etc/pip.conf,
# /etc/xdg/pip, ~/.config/pip, ~/.pip), the local paths they or PIP_* name (find-links, file://
# indexes, cert, constraints), the CA certificates, and the PIP_* environment (as an env file the
# Dockerfile's pip step sources). Format `docker` (OCI drops HEALTHCHECK), isolation chroot.
#
# Checks (the image's own python runs deploy/image_check.py as the image's user, next to the
# server started from the image's ENTRYPOINT + CMD on a free 127.0.0.1 port): non-root uid,
# torch not importable, /v2/health/ready, classify / translate / tag of every baked bundle, a v2
# infer, /metrics, and the image's HEALTHCHECK command. Prints `check NAME: ok|FAILED ...`
# lines, the image size, and `build-image: all checks passed` at the end; exits non-zero
# otherwise.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
TARGET=cpu
BUNDLES=""
TAG=""
CHECK=1
BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        cpu) TARGET=cpu ;;
        gpu) echo "build-image: the gpu target needs ${REPO}/Dockerfile's CUDA_IMAGE, which" \
                  "cannot be pulled here; only cpu is built (tests/deploy lints gpu)" >&2
             exit 2 ;;
        --bundles) BUNDLES=$(cd "$2" && pwd); shift ;;
        --tag) TAG=$2; shift ;;
        --no-check) CHECK=0 ;;
        --check-only) BUILD=0 ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "build-image: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
TAG=${TAG:-localhost/seqserve:${TARGET}}
CACHE=${SEQSERVE_IMAGE_CACHE:-/var/tmp/seqserve-image-base}
LOCAL_BASE=localhost/seqserve-python-base:bookworm
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
START=$(date +%s)

say() { echo "build-image: $*"; }
elapsed() { echo "$(( $(date +%s) - START )) s"; }

# --- tools ---------------------------------------------------------------------------------
apt_install() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "build-image: $* missing and not root: cannot apt-get install it" >&2
        exit 1
    fi
    say "installing $* (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "$@" >/dev/null
}
command -v buildah >/dev/null 2>&1 || apt_install buildah
if [ "$(id -u)" -ne 0 ]; then
    echo "build-image: run as root (chroot isolation and the debootstrap base need it)" >&2
    exit 1
fi
if [ -z "${STORAGE_DRIVER:-}" ] && ! buildah info >/dev/null 2>&1; then
    # e.g. inside a container whose root is overlayfs: the default overlay driver fails there.
    say "buildah's default storage driver does not work here: using vfs (slower)"
    export STORAGE_DRIVER=vfs
fi

# --- base image (the functions run only when building) ----------------------------------------------------------------------------
dockerfile_arg() {  # the default of a global ARG of the Dockerfile
    sed -n "s/^ARG $1=//p" "$REPO/Dockerfile" | head -1
}
have_image() { buildah inspect --type image "$1" >/dev/null 2>&1; }

local_base() {
    have_image "$LOCAL_BASE" && return 0
    local tarball="$CACHE/$SUITE-python3.tar"
    if [ ! -s "$tarball" ]; then
        command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
        mkdir -p "$CACHE"
        local root
        root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
        say "debootstrap --variant=minbase $SUITE (python3, python3-venv) into $root"
        if ! debootstrap --variant=minbase --include=python3,python3-venv \
                "$SUITE" "$root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1; then
            tail -20 "$CACHE/debootstrap.log" >&2
            rm -rf "$root"
            exit 1
        fi
        ln -sf python3 "$root/usr/bin/python"
        rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
               "$root"/var/log/* "$root"/tmp/*
        tar -C "$root" -cf "$tarball.tmp" .
        mv "$tarball.tmp" "$tarball"
        rm -rf "$root"
        say "base rootfs cached in $tarball ($(du -h "$tarball" | cut -f1), $(elapsed))"
    fi
    local ctr
    ctr=$(buildah from scratch)
    buildah add --quiet "$ctr" "$tarball" / >/dev/null
    buildah config --env LANG=C.UTF-8 \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd python3 "$ctr"
    buildah commit --quiet --format docker --rm "$ctr" "$LOCAL_BASE" >/dev/null
    say "base image $LOCAL_BASE committed ($(elapsed))"
}

qualified() {  # an image reference with its registry (Docker's rules for short names)
    local first=${1%%/*}
    if [ "$first" = "$1" ]; then echo "docker.io/library/$1"
    elif [[ "$first" == *.* || "$first" == *:* || "$first" == localhost ]]; then echo "$1"
    else echo "docker.io/$1"
    fi
}

pick_base() {  # sets BASE
    BASE=$(dockerfile_arg PYTHON_IMAGE)
    if have_image "$BASE"; then
        say "base $BASE (local storage)"
    elif timeout 90 buildah pull --quiet "$(qualified "$BASE")" >/dev/null 2>&1; then
        say "base $BASE (pulled)"
    else
        say "base $BASE cannot be pulled here: using $LOCAL_BASE (debootstrap $SUITE)"
        local_base
        BASE=$LOCAL_BASE
    fi
}

WORK=$(mktemp -d /var/tmp/seqserve-build.XXXXXX)
CTR=""
SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
    [ -z "$CTR" ] || buildah rm "$CTR" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

make_context() {  # the files the Dockerfile copies, plus the bundles to bake; sets CTX, BAKE
    CTX=$WORK/context
    mkdir -p "$CTX/bake"
    cp "$REPO/Dockerfile" "$REPO/.dockerignore" "$REPO/pyproject.toml" "$REPO/README.md" "$CTX/"
    (cd "$REPO" && tar --exclude=__pycache__ --exclude='*.pyc' --exclude='_front*.so' \
        --exclude=native/front/target -cf - seqserve native) | tar -C "$CTX" -xf -
    BAKE=0
    if [ -n "$BUNDLES" ]; then
        cp -R "$BUNDLES/." "$CTX/bake/"
        BAKE=1
        say "baking $(find "$CTX/bake" -mindepth 1 -maxdepth 1 -type d | wc -l) model" \
            "folder(s) of $BUNDLES"
    fi
}

MOUNTS=()
declare -A MOUNTED=()
mount_ro() {  # mount_ro HOST_PATH [CONTAINER_PATH]: once per container path, if it exists
    local src=$1 dst=${2:-$1}
    [ -e "$src" ] || return 0
    [ -z "${MOUNTED[$dst]:-}" ] || return 0
    MOUNTED[$dst]=1
    MOUNTS+=(-v "$src:$dst:ro")
}

pip_mounts() {  # what the build sees of this machine's pip setup, read-only; sets MOUNTS
    mount_ro /etc/pip.conf
    mount_ro /etc/xdg/pip
    mount_ro "$HOME/.config/pip" /root/.config/pip
    mount_ro "$HOME/.pip" /root/.pip
    mount_ro /etc/ssl/certs
    # Local paths that pip's configuration names (find-links, file:// indexes, cert,
    # constraint), a file:// index's parent too (its pages link ../../files/...).
    local pip_host="" p value token path
    for p in "$REPO/.venv/bin/pip" pip3 pip; do
        if command -v "$p" >/dev/null 2>&1; then pip_host=$p; break; fi
    done
    if [ -n "$pip_host" ]; then
        while IFS= read -r value; do
            for token in $value; do
                path=${token#file://}
                case "$path" in /*) ;; *) continue ;; esac
                if [ "$path" != "$token" ]; then mount_ro "$(dirname "${path%/}")"; fi
                mount_ro "$path"
            done
        done < <("$pip_host" config list 2>/dev/null | sed -n "s/^[^=]*=//p" | tr -d "'\"")
    fi
    # The PIP_* environment: an env file that the Dockerfile's pip step sources when present.
    mkdir -p "$WORK/pip-env"
    local line name
    env | grep -E '^PIP_[A-Z0-9_]+=' | grep -v '^PIP_NO_CACHE_DIR=' | while IFS= read -r line; do
        name=${line%%=*}
        value=${line#*=}
        printf "export %s='%s'\n" "$name" "${value//\'/\'\\\'\'}"
    done >"$WORK/pip-env/pip.env"
    MOUNTS+=(-v "$WORK/pip-env:/run/seqserve-build:ro")
}

# The build's disk at its peak, with a margin (measured: docs/deployment.md).
MIN_FREE_MB=${SEQSERVE_IMAGE_MIN_FREE_MB:-2500}
NO_DISK=3  # exit status: not enough free disk to build (nothing tried)
check_disk() {
    local root free
    root=$(buildah info --format '{{.store.GraphRoot}}' 2>/dev/null || echo /var/lib/containers/storage)
    while [ ! -d "$root" ]; do root=$(dirname "$root"); done
    free=$(df --output=avail -B1M "$root" | tail -1 | tr -d ' ')
    if [ "$free" -lt "$MIN_FREE_MB" ]; then
        echo "build-image: not enough disk: ${free} MB free under $root, the build needs" \
             "${MIN_FREE_MB} MB (SEQSERVE_IMAGE_MIN_FREE_MB)" >&2
        exit "$NO_DISK"
    fi
}

build() {
    check_disk
    pick_base
    make_context
    pip_mounts
    local old_id new_id t0
    old_id=$(buildah inspect --type image --format '{{.FromImageID}}' "$TAG" 2>/dev/null || true)
    say "buildah build --target $TARGET -> $TAG (base $BASE)"
    t0=$(date +%s)
    buildah build --isolation chroot --format docker --target "$TARGET" --tag "$TAG" \
        --build-arg "PYTHON_IMAGE=$BASE" --build-arg "BAKE_DEMO_MODELS=$BAKE" \
        --build-arg BUNDLES_DIR=bake "${MOUNTS[@]}" \
        --file "$CTX/Dockerfile" "$CTX"
    say "built $TAG in $(( $(date +%s) - t0 )) s"
    new_id=$(buildah inspect --type image --format '{{.FromImageID}}' "$TAG")
    if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then  # the previous build of this tag
        buildah rmi "$old_id" >/dev/null 2>&1 || true
    fi
}

if [ "$BUILD" -eq 1 ]; then
    build
fi
SIZE=$(buildah images --format '{{.Size}}' "$TAG" | head -1)

if [ "$CHECK" -eq 0 ]; then
    say "image $TAG size $SIZE"
    exit 0
fi

# --- run it and check it -------------------------------------------------------------------
# Processes through /proc (no procps needed).
proc_args() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null || true; }
first_child() {
    local stat rest
    for stat in /proc/[0-9]*/stat; do
        rest=$(cat "$stat" 2>/dev/null) || continue
        rest=${rest##*) }  # after "pid (comm) ": state ppid ...
        read -r _ ppid _ <<<"$rest"
        if [ "$ppid" = "$1" ]; then
            stat=${stat#/proc/}
            echo "${stat%/stat}"
            return 0
        fi
    done
    return 1
}
buildah inspect --type image "$TAG" >"$WORK/inspect.json"
CTR=$(buildah from --quiet "$TAG")
in_image() { buildah run --isolation chroot "$CTR" -- "$@"; }
config() {  # config FIELD: a field of the image's Docker config, one line per list item
    in_image python -c '
import json, sys
value = json.load(sys.stdin)["Docker"]["config"].get(sys.argv[1])
if sys.argv[1] == "Healthcheck":
    value = (value or {}).get("Test") or []
print("\n".join(value) if isinstance(value, list) else value or "")' "$1" <"$WORK/inspect.json"
}
USER_SPEC=$(config User)
IMAGE_UID=${USER_SPEC%%:*}
PORT=$(in_image python -c '
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
# ENTRYPOINT + CMD as the image has them, with the listen address moved to a free local port
# and gRPC to a free one of its own (chroot isolation shares the host's network; flags given
# last win).
mapfile -t SERVE < <(config Entrypoint; config Cmd)
SERVE+=(--host 127.0.0.1 --port "$PORT" --grpc-port 0)
say "serving: ${SERVE[*]} (as the image's USER $USER_SPEC)"
buildah run --isolation chroot "$CTR" -- "${SERVE[@]}" >"$WORK/server.log" 2>&1 &
SERVER_PID=$!  # buildah run itself: it passes SIGTERM on to the server

STATUS=0
in_image python - "http://127.0.0.1:$PORT" "$IMAGE_UID" <"$REPO/deploy/image_check.py" \
    || STATUS=1
# The HEALTHCHECK the image carries (kept by --format docker), on the port used here.
mapfile -t HEALTH < <(config Healthcheck | sed "s/:8080\//:$PORT\//")
if [ "${HEALTH[0]:-}" = CMD ] && in_image "${HEALTH[@]:1}"; then
    echo "check healthcheck: ok the image's HEALTHCHECK command passed"
else
    echo "check healthcheck: FAILED HEALTHCHECK missing from the image or not passing"
    STATUS=1
fi
# The Dockerfile builds the native HTTP front (native/build.sh); the image serves on it.
front=$(grep -m1 -o "HTTP front: .*" "$WORK/server.log" || echo "no 'HTTP front:' line in its log")
case "$front" in
    "HTTP front: native"*) echo "check native-front: ok $front" ;;
    *) echo "check native-front: FAILED $front"; STATUS=1 ;;
esac
if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "check server-running: FAILED the server exited early"
    STATUS=1
else
    # What a container runtime does on stop: the image's STOPSIGNAL to the container's first
    # process, the server (buildah run kills its child on SIGTERM instead of passing it on).
    server=$SERVER_PID
    while [[ "$(proc_args "$server")" == buildah* ]]; do
        server=$(first_child "$server")
    done
    server_uid=$(sed -n 's/^Uid:[[:space:]]*\([0-9]*\).*/\1/p' "/proc/$server/status")
    if [ "$server_uid" = "$IMAGE_UID" ] && [ "$server_uid" != 0 ]; then
        echo "check server-uid: ok the server process runs as uid $server_uid"
    else
        echo "check server-uid: FAILED the server process runs as uid $server_uid"
        STATUS=1
    fi
    say "stopping the server (pid $server: $(proc_args "$server")) with $(config StopSignal)"
    kill -"$(config StopSignal)" "$server"
    if timeout 60 tail --pid="$SERVER_PID" -f /dev/null; then
        wait "$SERVER_PID" && code=0 || code=$?
        if [ "$code" -eq 0 ]; then
            echo "check sigterm-exit: ok the server exited 0 on SIGTERM"
        else
            echo "check sigterm-exit: FAILED the server exited $code on SIGTERM"
            STATUS=1
        fi
    else
        echo "check sigterm-exit: FAILED the server still runs 60 s after SIGTERM"
        STATUS=1
    fi
fi
if [ "$STATUS" -ne 0 ]; then
    echo "--- server log (last 60 lines) ---"
    tail -n 60 "$WORK/server.log"
fi
say "image $TAG size $SIZE"
if [ "$STATUS" -ne 0 ]; then
    say "checks FAILED ($(elapsed))"
    exit 1
fi
say "all checks passed ($(elapsed))"
