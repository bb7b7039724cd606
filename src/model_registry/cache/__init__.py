"""A model's results by content: the cache (`results`) and its keys (`keys`)."""
