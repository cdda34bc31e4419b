"""The REST service (FastAPI)."""
