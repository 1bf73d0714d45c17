"""The peers every figure is measured against: HF `datasets`, in-RAM pyarrow, a local memory-mapped Arrow file,
Arrow Flight over loopback, a raw TCP loopback ceiling, and a LeRobot-style per-sample window reader."""
