# kube-headroom controller image. Multi-stage: wheels are built with pip in a full
# Python image; the runtime stage gets only them, runs as a non-root UID, and needs no
# writable filesystem (the chart mounts it read-only).
# Not built on the development machines (no Docker engine there); linted with hadolint
# by the test suite (tests/unit/test_dockerfile.py). `make image` builds the same image
# without Docker (tests/testbed/controller_image.py; a test checks the two agree).

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY controller/ controller/
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
RUN groupadd --gid 65532 headroom && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin headroom
COPY --from=build /wheels /wheels
ARG VERSION=0.1.0
RUN pip install --no-cache-dir --no-index --find-links=/wheels "kube-headroom==${VERSION}" && rm -rf /wheels

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 8080 8081 9443
ENTRYPOINT ["headroom"]
CMD ["run"]
