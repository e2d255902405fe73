# delay-bridge image. Build: buildah bud -t delay-bridge . (or docker build -t delay-bridge .)
# BASE_IMAGE must be a Debian-based image with python3 >= 3.11 and its venv module.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bridge ./bridge
RUN python3 -m venv /opt/delay-bridge \
    && /opt/delay-bridge/bin/python -m pip install --no-cache-dir --disable-pip-version-check "/src[otel]"

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="delay-bridge" \
      org.opencontainers.image.description="Delayed delivery for Apache Kafka, backed by Redis" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/delay-bridge/delay-bridge"
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 bridge \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin bridge
COPY --from=build /opt/delay-bridge /opt/delay-bridge
COPY config/bridge.yaml /etc/delay-bridge/bridge.yaml
ENV PATH=/opt/delay-bridge/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DELAY_BRIDGE_CONFIG=/etc/delay-bridge/bridge.yaml \
    DELAY_BRIDGE_LOGGING__JSON=true
USER 10001:10001
EXPOSE 9464
ENTRYPOINT ["tini", "--", "delay-bridge"]
CMD ["run"]
