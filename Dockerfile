# syntax=docker/dockerfile:1.7
# One image for the four Engram services; the command picks one:
#   docker run engram python -m services.shard   (governance, artifacts, compactor alike)
# The `engram` CLI is in the image too (the compose init container mints tokens with it), and
# with it `engram gateway`, the HTTP/JSON gateway (the gateway extra).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/engram
WORKDIR /src
# Dependencies first, in their own layer: it is rebuilt only when the lockfile changes.
COPY pyproject.toml requirements.lock ./
# The lockfile pins every version; -c keeps those pins while installing only the runtime
# dependencies, the client's, the server extra's and the gateway's (the lockfile also holds the dev tools,
# which the image does not need).
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['server'] + p['optional-dependencies']['gateway']))" > runtime.txt \
 && /opt/engram/bin/pip install -c requirements.lock -r runtime.txt
COPY engram ./engram
COPY services ./services
RUN /opt/engram/bin/pip install --no-deps . \
 && /opt/engram/bin/python -m compileall -q /opt/engram/lib

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="engram" \
      org.opencontainers.image.description="Durable, verifiable memory for fleets of AI agents (gRPC services)" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric uid/gid so Kubernetes runAsNonRoot can check it without reading /etc/passwd.
RUN groupadd --system --gid 10001 engram \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin engram \
 && mkdir -p /run/engram/auth /var/lib/engram \
 && chown 10001:10001 /run/engram/auth /var/lib/engram
COPY --from=build /opt/engram /opt/engram
ENV PATH=/opt/engram/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    ENGRAM_HOME=/var/lib/engram
USER 10001:10001
WORKDIR /var/lib/engram
# gRPC ports: shard 50051, governance 50052, artifacts 50053, compactor 50054; metrics 9101-9104;
# the HTTP gateway 8080.
EXPOSE 50051 50052 50053 50054 9101 9102 9103 9104 8080
CMD ["python", "-m", "services.shard"]
