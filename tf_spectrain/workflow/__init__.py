"""The Keras workflow the pipeline reproduces: compile arguments, data into batches, logs."""
