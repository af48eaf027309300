"""Tokens <-> text: tokenizers, incremental detokenization, chat templates, stop strings."""
