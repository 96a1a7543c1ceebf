"""``sam2serve bench``: the published SAM2 latency experiment (AMG, SPS, MPS), run on this
machine, one fresh process per mode and task, with accuracy against the baseline; and
video tracking (``--task video``) against Meta's video predictor.

- :mod:`~sam2serve.bench.runner` plans the runs and compares the masks;
- :mod:`~sam2serve.bench.worker` is the process that runs one mode and task;
- :mod:`~sam2serve.bench.reference` runs Meta's own code (mode ``reference``);
- :mod:`~sam2serve.bench.metrics` computes latency statistics, mIoU and fail counts;
- :mod:`~sam2serve.bench.report` writes the CSV, the Markdown and the PNG chart;
- :mod:`~sam2serve.bench.video` plans and compares the video task's runs (the worker runs
  them), :mod:`~sam2serve.bench.video_reference` is Meta's ``SAM2VideoPredictor`` as row
  ``reference``, :mod:`~sam2serve.bench.video_report` its CSV, Markdown and chart.
"""
