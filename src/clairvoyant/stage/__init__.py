"""The staging engine: copies upcoming samples to node-local storage."""
