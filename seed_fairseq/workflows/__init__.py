"""Commands that run the whole pipeline: the comparison (``compare``), domain adaptation and its
study (``adapt``) and the GPU check (``gpucheck``).

What they share sits in ``kit`` (plans, output folders, held-out sets, logs, interrupts,
statistics) and ``measure`` (FLOPs, memory, the data feed); a workflow never imports another.
"""
