"""What a valid job is, in one home: building, validating and hashing a submitted job
(``spec``), which types are known and what a router registers (``types``), and schedules: their
rules, ticks and validation (``schedules``). The API, ``enqueue()``, the worker's follow-ups, the
CLI and the sweeper all go through these rules; the caller's connection and schema are found by
``connection``."""
