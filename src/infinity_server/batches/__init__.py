"""Batch jobs in OpenAI's Batch API shape, durable in SQLite: see docs/batches.md.

`store` (the database), `files` (the files' bytes), `lines` (one line, run in-process through its
route), `runner` (the background runner), `service` (the state the lifespan starts and stops),
`api` (the routes).
"""

from infinity_server.batches.api import operations
from infinity_server.batches.service import Batches

__all__ = ["Batches", "operations"]
