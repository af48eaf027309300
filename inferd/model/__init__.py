"""Files on disk -> a model in memory (GGUF files and Hugging Face folders)."""
