"""episerve server: episode-filtered Arrow IPC rows from memory-mapped caches of parquet datasets."""

__version__ = "0.1.0"
