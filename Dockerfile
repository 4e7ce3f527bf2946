# The autoshard plan service: `docker build -t autoshard .` then
# `docker run -p 8000:8000 -v autoshard-plans:/data autoshard`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AUTOSHARD_DB=/data/autoshard-plans.sqlite3

RUN useradd --create-home --uid 10001 autoshard \
    && mkdir /data && chown autoshard:autoshard /data

WORKDIR /src
COPY pyproject.toml README.md ./
COPY autoshard ./autoshard
COPY cost_models ./cost_models
COPY service ./service
# the same install CI runs
RUN pip install . && rm -rf /src

USER autoshard
WORKDIR /home/autoshard
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"]

ENTRYPOINT ["autoshard", "serve", "--host", "0.0.0.0", "--port", "8000"]
