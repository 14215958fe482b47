"""The parent process: plan trials, find backends, start worker processes, keep the run
directory, verify, and orchestrate a comparison (`compare`)."""
