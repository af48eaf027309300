"""The generating APIs, one package each: a request Struct (request.py), a renderer (render.py) and an encoder
(encode.py) on the one pipeline of inferd/server/generation.py; inferd/server/routes.py ties each to its path."""
