"""dctwin's service: site model, store, ingest, and the `dctwin` command line."""
