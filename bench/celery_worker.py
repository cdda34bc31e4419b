"""The Celery worker's app: ``python -m celery -A bench.celery_worker worker ...`` (settings from
``BENCH_CELERY_*``, see ``bench.celery_app``)."""

from bench.celery_app import app_from_env

app = app_from_env()
