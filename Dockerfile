# Gantry's image: the web server by default; the Celery worker, Celery beat
# and the coordinator (with the Docker launcher) run from the same image with
# another command (see docker-compose.yml). The runs themselves go in
# containers of the runner image, runners/Dockerfile (docs/launchers.md).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=gantry.settings \
    GANTRY_DATA_DIR=/data

WORKDIR /app

# Dependencies first: this layer is rebuilt only when the lock changes. The
# lock pins every runtime dependency, transitive ones too, with hashes
# (.ci/lock-check keeps it in step with requirements.txt); the embedded
# databases of the development path are not in it.
COPY requirements.lock .
RUN pip install --require-hashes --no-deps -r requirements.lock

# The code stays root-owned (read-only to the service); the service user can
# write only its data folder (the generated secret key when GANTRY_SECRET_KEY
# is unset, Celery beat's schedule).
RUN useradd --system --uid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gantry \
    && mkdir -p /data \
    && chown gantry:gantry /data
COPY . .

USER gantry
EXPOSE 8000

# The ASGI mode: gunicorn runs uvicorn's worker on gantry.asgi, so a parked long
# poll holds no thread and no database connection; every other route runs in a
# pool of GANTRY_SYNC_THREADS threads per worker (docs/operations.md, "Serving").
# One worker per core. No control socket: it would go under the (missing) home
# folder, and nothing uses it. Extra flags: GUNICORN_CMD_ARGS="--workers 4".
CMD ["gunicorn", "gantry.asgi", "-b", "0.0.0.0:8000", "--worker-class", "uvicorn_worker.UvicornWorker", "--workers", "2", "--no-control-socket", "--access-logfile", "-"]
