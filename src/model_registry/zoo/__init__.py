"""What published models look like: their files' facts, LLM rerankers' prompt templates, where a
model reference points, and the catalogue of known models."""
