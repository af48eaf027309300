"""The Responses API: POST /v1/responses, and the stored responses behind GET and DELETE /v1/responses/{id}."""
