"""Ollama's API (/api/chat, /api/generate, /api/embed, /api/tags, ...): what Open WebUI, Continue and the `ollama`
clients speak, on the same pipeline and model as the OpenAI APIs."""
