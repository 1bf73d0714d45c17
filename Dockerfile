# episerve-server image: a virtualenv with the server and its dependencies on python:3.11-slim.
#
#   docker build -t episerve-server .
#   docker run --rm -p 127.0.0.1:8000:8000 episerve-server                       # serves the built-in demo
#   docker run --rm -p 127.0.0.1:8000:8000 -v /srv/datasets:/data:ro \
#       -v episerve-cache:/cache -e EPISERVE_ROOTS=/data episerve-server           # serves /srv/datasets
#
# Layers are ordered for the build cache: the dependencies (from pyproject.toml and constraints.txt alone) are
# installed before the source is copied, so editing app/ rebuilds only the small last layers. Nothing is fetched at
# run time. Tested by tests/deploy/run.sh.

ARG PYTHON_IMAGE=python:3.11-slim

# ---- dependencies: a virtualenv holding everything pyproject.toml requires, but not the server ----------------
# The venv has no pip of its own (--without-pip): the base image's pip installs into it (`pip --python`), which
# keeps pip and setuptools out of the runtime image. Test suites and C headers of the wheels are dropped too.
FROM ${PYTHON_IMAGE} AS deps
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python -m venv --without-pip /opt/venv
WORKDIR /src
# The server's dependencies, read from pyproject.toml, pinned by constraints.txt (the versions the test suite runs).
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
 && python -m pip --python /opt/venv/bin/python install -c constraints.txt -r /tmp/requirements.txt \
 && cd /opt/venv/lib/python3.11/site-packages \
 && rm -rf pyarrow/tests pyarrow/include numpy/tests numpy/*/tests numpy/*/*/tests \
 && find pyarrow -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' | xargs rm -f

# ---- build: a wheel of the server from this checkout ---------------------------------------------------------
# The episode viewer's browser libraries (uPlot, apache-arrow) come with app/: they are kept built in
# app/ui/vendor, so no Node is needed here either.
FROM deps AS build
# README.m[d]: pyproject.toml names README.md as the long description; the glob keeps the build working before
# the file exists.
COPY pyproject.toml README.m[d] ./
COPY app ./app
RUN python -m pip wheel --no-deps --wheel-dir /wheels .

# ---- runtime ---------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="episerve-server" \
      org.opencontainers.image.description="Serve LeRobot-style parquet datasets as Arrow IPC streams" \
      org.opencontainers.image.licenses="Apache-2.0"
ARG UID=10001
RUN groupadd --gid "${UID}" episerve \
 && useradd --uid "${UID}" --gid episerve --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin episerve \
 && mkdir -p /data /cache \
 && chown episerve:episerve /cache
COPY --from=deps /opt/venv /opt/venv
COPY --from=build /wheels /tmp/wheels
RUN PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
    python -m pip --python /opt/venv/bin/python install --no-cache-dir --no-deps --no-index /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels \
 && /opt/venv/bin/python -c "import app.main, app.cli" \
 && /opt/venv/bin/python -c "import app.api.ui as ui; assert (ui.VENDOR_DIRECTORY / 'uplot.min.js').is_file()" \
 && /opt/venv/bin/episerve-server --help >/dev/null

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    EPISERVE_HOST=0.0.0.0 \
    EPISERVE_PORT=8000 \
    EPISERVE_WORKERS=1 \
    EPISERVE_CACHE_DIR=/cache \
    EPISERVE_LOG_LEVEL=info
# No EPISERVE_ROOTS: the image serves the built-in demo until you mount datasets and set EPISERVE_ROOTS=/data.

# /data: dataset roots, mount read-only. /cache: segment cache, shared safely by all workers and replicas.
VOLUME ["/data", "/cache"]
USER episerve
EXPOSE 8000

# The official slim image has no curl: probe with the standard library.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('EPISERVE_PORT', '8000'), timeout=4)"]

ENTRYPOINT ["episerve-server"]
CMD ["serve"]
