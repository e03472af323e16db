"""The pipeline runtime: what runs a `PipelineModel`'s stages on their devices.

`stage` (one stage's passes), `handoff` (blocking channels between stage threads),
`executor` (one epoch, a thread per stage), `loop` (the epochs of `fit`, with callbacks),
`state` (the read-only view callbacks get), `bookkeeping` (running loss and metrics),
`inference` (`evaluate` and `predict`), `probe` (measured weight-prediction errors).
"""
