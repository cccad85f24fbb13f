"""The heterogeneous scheduler (see docs/scheduler.md)."""
