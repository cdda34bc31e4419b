"""Conveyor's benchmark: ``make bench`` (or ``python -m bench.run --help``). See bench/README.md."""
