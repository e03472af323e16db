"""The pieces of `PipelineModel`'s face: the Keras model API and the Keras methods it runs."""
