# syntax=docker/dockerfile:1
#
# seqserve serving images. Two targets, one per ONNX Runtime flavour (never both in one image):
#
#   docker build --target cpu -t seqserve:cpu .
#   docker build --target gpu -t seqserve:gpu .
#   deploy/build-image.sh cpu --bundles DIR      (no Docker: buildah; then runs and checks it)
#
# The serving image has no torch and no compilers: it installs the package with the `cpu` or
# `gpu` extra only (never `train`). The CPU image serves on the native HTTP front
# (native/build.sh builds it in the build stage from Debian bookworm's Rust crate packages;
# only the built module reaches the image; where it cannot build, the image serves on
# uvicorn's front and says so at start; native/beam/build.sh builds the beam search's compiled
# step the same way, with gcc, or the search steps in numpy). Model bundles come from a volume mounted at /models by
# default; `--build-arg BAKE_DEMO_MODELS=1` bakes the bundles of the build-context folder
# BUNDLES_DIR (default deploy/bundles; e.g. `--build-arg BUNDLES_DIR=model_repository` after
# `seqserve demo`) into /models instead.
#
# tests/deploy/test_dockerfile.py lints this file with hadolint and runs its RUN, ENTRYPOINT,
# CMD and HEALTHCHECK commands in a throwaway virtualenv, so keep them plain shell.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04

# ---------------------------------------------------------------------------------------------
# Bundles: /models is empty unless BAKE_DEMO_MODELS=1 (then: every bundle folder of BUNDLES_DIR).
FROM ${PYTHON_IMAGE} AS bundles
ARG BAKE_DEMO_MODELS=0
ARG BUNDLES_DIR=deploy/bundles
COPY ${BUNDLES_DIR}/ /staging/
RUN mkdir -p /models \
    && if [ "${BAKE_DEMO_MODELS}" = "1" ]; then \
         find /staging -mindepth 1 -maxdepth 1 -type d -exec cp -R {} /models/ \; ; \
       fi

# ---------------------------------------------------------------------------------------------
# CPU: build the virtualenv (all dependencies are wheels) and the native front (native/build.sh
# apt-installs Debian's Rust toolchain and crates here, in the build stage, and with --clean
# purges them and its build folder in the same step, so the stage's layer, which the build
# machine's disk holds until the end, is the virtualenv only), then copy it over.
FROM ${PYTHON_IMAGE} AS cpu-build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY seqserve/ seqserve/
COPY native/ native/
# deploy/build-image.sh mounts the build machine's pip setup read-only: its config files at their
# usual paths and its PIP_* variables as /run/seqserve-build/pip.env (absent elsewhere).
RUN if [ -f /run/seqserve-build/pip.env ]; then . /run/seqserve-build/pip.env; fi \
    && python -m venv /opt/venv \
    && /opt/venv/bin/pip install ".[cpu]" \
    && { sh native/build.sh --clean /opt/venv/bin/python \
         || echo "native front not built: the image serves on uvicorn's front"; } \
    && { sh native/beam/build.sh --clean /opt/venv/bin/python \
         || echo "beam kernel not built: the image's beam search steps in numpy"; }

FROM ${PYTHON_IMAGE} AS cpu
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 seqserve \
    && useradd --system --uid 10001 --gid seqserve --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin seqserve
COPY --from=cpu-build /opt/venv /opt/venv
COPY --from=bundles --chown=10001:10001 /models /models
USER 10001:10001
WORKDIR /tmp
VOLUME ["/models"]
# HTTP, and the KServe v2 / Triton gRPC protocol
EXPOSE 8080 8001
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/v2/health/live', timeout=2)"]
ENTRYPOINT ["seqserve", "serve"]
CMD ["--repo", "/models", "--host", "0.0.0.0", "--port", "8080", "--grpc-port", "8001"]

# ---------------------------------------------------------------------------------------------
# GPU: CUDA 12 + cuDNN 9 runtime base (what onnxruntime-gpu 1.19+ links against), the distro's
# Python 3.12 in a virtualenv, onnxruntime-gpu instead of onnxruntime.
FROM ${CUDA_IMAGE} AS gpu-python
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3=3.12.* python3-venv=3.12.* \
    && rm -rf /var/lib/apt/lists/*

FROM gpu-python AS gpu-build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY seqserve/ seqserve/
RUN if [ -f /run/seqserve-build/pip.env ]; then . /run/seqserve-build/pip.env; fi \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install ".[gpu]"

FROM gpu-python AS gpu
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    SEQSERVE_DEVICE=cuda
RUN groupadd --system --gid 10001 seqserve \
    && useradd --system --uid 10001 --gid seqserve --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin seqserve
COPY --from=gpu-build /opt/venv /opt/venv
COPY --from=bundles --chown=10001:10001 /models /models
USER 10001:10001
WORKDIR /tmp
VOLUME ["/models"]
# HTTP, and the KServe v2 / Triton gRPC protocol
EXPOSE 8080 8001
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=180s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/v2/health/live', timeout=2)"]
ENTRYPOINT ["seqserve", "serve"]
CMD ["--repo", "/models", "--host", "0.0.0.0", "--port", "8080", "--grpc-port", "8001"]
