"""What a run leaves and what is computed from it: records (the on-disk schema), result rows
(`rows`, built by `summary`: intervals, speedups, verdicts; `conditions`: telemetry, host-bound,
busy host), what a record read back must hold and the migrations of older ones (`validation`),
verification checks (`checks`, and `full_size` for the checks whose cost stays flat in the
model's size), diffs between runs, the machine-drift control, all-reduce results, device
peaks, whether a configuration fits in device memory (`fit`), the GPU-to-GPU links a run had
(`links`), step-model fits and recommendations. No process is started here."""
