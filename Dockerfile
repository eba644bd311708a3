# Images for docker-compose.yml. `producer` is light (GPU hosts); `worker` carries the models.
FROM python:3.11-slim AS base
WORKDIR /app
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
COPY pyproject.toml README.md ./
COPY events events
COPY config config
COPY transport transport
COPY producers producers
COPY streams streams
COPY models models
COPY aip aip

FROM base AS producer
RUN pip install '.[producer]'
ENTRYPOINT ["aip"]
CMD ["produce", "nvml"]

FROM base AS worker
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install '.[stream]'
# reachable from other containers (Prometheus, schedulers); `aip worker` outside the image binds 127.0.0.1
ENV AIP_WEB_HOST=0.0.0.0
ENTRYPOINT ["aip"]
CMD ["worker"]

FROM base AS extender
# kube-scheduler / Volcano extender: the light client (kafka-python), no models
COPY clients clients
RUN pip install '.[producer]'
ENV AIP_EXTENDER_HOST=0.0.0.0
ENTRYPOINT ["aip"]
CMD ["extender"]
