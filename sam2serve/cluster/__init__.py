"""The service as a Ray Serve application: autoscaled replicas loading shared artifacts
(CPU) or an official checkpoint (CPU or GPU).

- :mod:`config`        the config file (a Ray Serve config file), checked with named errors
- :mod:`args`          an application's args: what its replicas load, on which device
- :mod:`artifacts`     artifacts from a directory or an fsspec URI (copied to a local cache)
- :mod:`checkpoints`   a checkpoint from a file or an fsspec URI (copied to a local cache)
- :mod:`model_source`  what a replica loads: fetched, then built into a Predictor (Ray-free)
- :mod:`readiness`     warm-up, the replica's report, its cold-start metrics
- :mod:`ingress`       the ASGI wrapper around the service app (routing, stamps, metrics)
- :mod:`app`           the deployment (``SAM2Replica``) and the application builders
- :mod:`lifecycle`     ``cluster up | status | down``
- :mod:`client`        a retrying client; :mod:`protocol` the headers it shares with replicas
- :mod:`burst`         the burst benchmark (the ``cluster`` commands are in sam2serve.commands)
"""
