"""The tasks a registry runs, each a function over `runtime.runner.Runner`: embed (prompts,
truncation, long inputs), rerank, score pairs, classify, rank media against a query, tokenize;
and the input checks they share."""
