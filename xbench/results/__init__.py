"""What a run leaves and what is computed from it: records (the on-disk schema), result rows
(`rows`, built by `summary`: intervals, speedups, verdicts; `conditions`: telemetry, host-bound,
busy host), verification checks, diffs between runs, the machine-drift control, all-reduce
results, device peaks, step-model fits and recommendations. No process is started here."""
