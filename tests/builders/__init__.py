"""Builders of tiny random models and test inputs, saved to disk and loaded back by the real code.

One module per family: `text` (tokenizers, BERT, Qwen2), `zoo` (cross-encoders, SPLADE, ColBERT,
BGE-M3), `xlmr`, `media` (CLIP, CLAP, ColPali, images and audio) and `lifecycle` (fake models).
"""
