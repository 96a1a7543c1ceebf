"""``sam2serve bench``: the published SAM2 latency experiment (AMG, SPS, MPS), run on this
machine, one fresh process per mode and task, with accuracy against the baseline.

- :mod:`~sam2serve.bench.runner` plans the runs and compares the masks;
- :mod:`~sam2serve.bench.worker` is the process that runs one mode and task;
- :mod:`~sam2serve.bench.reference` runs Meta's own code (mode ``reference``);
- :mod:`~sam2serve.bench.metrics` computes latency statistics, mIoU and fail counts;
- :mod:`~sam2serve.bench.report` writes the CSV, the Markdown and the PNG chart.
"""
