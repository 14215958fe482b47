"""The worker process: one backend, one device count, one framework imported.

Started as `python -m xbench.worker`; it reads a `Job` and answers with events (both in
`xbench.wire`). It imports only the plugin contract, the wire types, the statistics and the
errors, never the parent's modules (see `xbench.worker.main`)."""
