"""The pipeline runtime: stage passes (`stage`), hand-offs (`handoff`), epochs (`executor`)."""
