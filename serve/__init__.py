"""The serving stack: runner processes under a memory-aware scheduler, the HTTP server speaking
Ollama's and OpenAI's APIs, and the terminal chat. It imports the verified core (``impl``) and the
scheduler rules (``spec.scheduler``); ``impl`` never imports it (docs/architecture.md)."""
