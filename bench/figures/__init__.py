"""One module per figure of the performance targets (P1-P8); each `run(ctx)` returns report rows."""
