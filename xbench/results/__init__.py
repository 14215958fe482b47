"""What a run leaves and what is computed from it: records, summary rows, verification
checks, diffs between runs, step-model fits and recommendations. No process is started here."""
