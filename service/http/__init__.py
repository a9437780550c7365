"""The web surface: the app, its routes, schemas and middleware, the LibreTranslate API,
connection limits, and the one table mapping the service's errors to HTTP statuses. The only room
that imports FastAPI or Starlette."""
